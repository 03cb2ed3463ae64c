// `diffattn explore`: the interactive explorer on a loopback address (src/explorer/).
#include <iostream>

#include "cli/args.h"
#include "diffattn/explorer/explorer.h"
#include "diffattn/http/http_server.h"

namespace diffattn::cli {

namespace {

void announce(const std::string& host, int port) {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::cout << "diffattn explore: listening on http://" << h << ":" << port
            << "/  (Ctrl-C stops it)" << std::endl;
}

int run_explore(const std::vector<std::string>& argv) {
  Args args("explore",
            "Start the differential attention explorer, a web page on this machine: pick the\n"
            "textbook example or a seeded random head, drag lambda, switch signed/clamp mode and\n"
            "the causal mask, click a row to see its distribution in map 1, map 2, the\n"
            "differential map and standard attention (numbers on hover and in a table). Every\n"
            "number comes from the library; the page loads nothing from elsewhere.\n"
            "--model DIR[,DIR...] adds trained models as a source: type a prompt (at most 96\n"
            "tokens), pick the layer and the head (or the head mean); its maps are recomputed from\n"
            "the saved lse of the fused forward. The slider replaces the learned lambda (V1: the\n"
            "layer's, V2: sigmoid(lambda_proj x) per token) until \"learned lambda\" is pressed.\n"
            "A DIFF model's \"standard\" view is its pair's full-width map softmax([q1;q2].[k1;k2] /\n"
            "sqrt(2D)); a standard model shows only its own softmax map.\n"
            "Limits of the server: " + std::to_string(explorer::kServerWorkers) +
            " connections served at once and " + std::to_string(explorer::kServerQueue) +
            " waiting (more: 503 at once);\na request must arrive within " +
            std::to_string(explorer::kRequestSeconds) +
            " s of its first byte (else 408), its request line and\nheaders within " +
            std::to_string(explorer::kMaxHeadBytes / 1024) + " KiB (431) and its body within " +
            std::to_string(explorer::kMaxBodyBytes / 1024) +
            " KiB (413; no compressed or chunked body:\n415, 411); a response must be taken within " +
            std::to_string(explorer::kResponseSeconds) + " s; an idle connection is closed\nafter " +
            std::to_string(explorer::kIdleSeconds) + " s, any connection after " +
            std::to_string(explorer::kKeepAliveRequests) +
            " requests.\nThe port is bound exclusively: a port in use is an error, never shared.");
  args.option("--model", "DIR", "", "trained model directories to offer, comma-separated (DIR,DIR,...)")
      .option("--host", "ADDR", "127.0.0.1", "loopback address to listen on")
      .option("--port", "N", "8765", "port; 0 picks a free one (printed)");
  if (!args.parse(argv)) return 0;
  const int port = static_cast<int>(args.integer("--port", 0, 65535));
  if (!http::is_loopback(args.str("--host"))) {  // before the models are loaded
    throw UsageError("--host must be a loopback address (127.0.0.1, ::1 or localhost), got \"" +
                     args.str("--host") + "\"");
  }
  if (args.given("--model")) {
    std::string dirs = args.str("--model");
    size_t at = 0;
    while (at <= dirs.size()) {
      const size_t comma = dirs.find(',', at);
      const std::string d = dirs.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (!d.empty()) {
        explorer::add_model(d);
        std::cout << "diffattn explore: model " << d << std::endl;
      }
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  explorer::serve(args.str("--host"), port, announce);
  return 0;
}

const CommandRegistration reg({"explore", "the interactive explorer in a browser (loopback only)", 50,
                               run_explore});

}  // namespace

}  // namespace diffattn::cli
