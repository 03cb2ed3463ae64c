// `diffattn serve`: the interactive explorer on a loopback address (src/explorer/).
#include <iostream>

#include "cli/args.h"
#include "diffattn/explorer.h"

namespace diffattn::cli {

namespace {

void announce(const std::string& host, int port) {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::cout << "diffattn serve: listening on http://" << h << ":" << port
            << "/  (Ctrl-C stops it)" << std::endl;
}

int run_serve(const std::vector<std::string>& argv) {
  Args args("serve",
            "Start the differential attention explorer, a web page on this machine: pick the\n"
            "textbook example or a seeded random head, drag lambda, switch signed/clamp mode and\n"
            "the causal mask, click a row to see its distribution in map 1, map 2, the\n"
            "differential map and standard attention (numbers on hover and in a table). Every\n"
            "number comes from the library; the page loads nothing from elsewhere.");
  args.option("--host", "ADDR", "127.0.0.1", "loopback address to listen on")
      .option("--port", "N", "8765", "port; 0 picks a free one (printed)");
  if (!args.parse(argv)) return 0;
  explorer::serve(args.str("--host"), static_cast<int>(args.integer("--port")), announce);
  return 0;
}

const CommandRegistration reg({"serve", "the interactive explorer in a browser (loopback only)", 50,
                               run_serve});

}  // namespace

}  // namespace diffattn::cli
