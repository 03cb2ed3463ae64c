// `diffattn serve --model DIR`: the OpenAI-compatible HTTP server (src/serve/).
#include <cstdlib>
#include <iostream>

#include "cli/args.h"
#include "diffattn/base/dtype.h"
#include "diffattn/http/http_server.h"
#include "diffattn/serve/server.h"

namespace diffattn::cli {

namespace {

int run_serve(const std::vector<std::string>& argv) {
  Args args("serve",
            "Serve a model over the OpenAI HTTP API: POST /v1/completions, POST\n"
            "/v1/chat/completions (the model's own chat template: chat_template.jinja or tokenizer_config.json),\n"
            "POST /tokenize {\"prompt\"} -> {\"tokens\", \"count\"}, POST /detokenize {\"tokens\"} -> {\"prompt\"},\n"
            "GET /v1/models, GET /health and GET /metrics (Prometheus text). Parameters: max_tokens\n"
            "(chat: max_completion_tokens), temperature, top_p, top_k, seed, stop, n, presence_penalty,\n"
            "frequency_penalty, logit_bias, logprobs and top_logprobs (completions: logprobs N),\n"
            "echo (completions), response_format (json_object, or json_schema: grammar-constrained\n"
            "decoding), stream (server-sent events ending in data: [DONE]; stream_options.include_usage\n"
            "adds a usage chunk). Other request fields are ignored (each logged once on stderr).\n"
            "Requests join and leave the running batch between decode steps (continuous batching);\n"
            "long prompts are prefilled in chunks between the running streams' tokens; each admitted\n"
            "sequence reserves KV blocks for its prompt plus max_tokens from one pool, and waits in a\n"
            "bounded queue while the pool is full (beyond it: 503); the K/V of earlier prompts that\n"
            "begin the same way is reused (prefix caching; usage.prompt_tokens_details).\n"
            "A client that disconnects cancels its sequences. SIGINT / SIGTERM end in-flight streams\n"
            "with an error event and exit 0. Listens on 127.0.0.1 unless --allow-remote is given;\n"
            "the port is bound exclusively (a port in use is an error). With --api-key, or\n"
            "DIFFATTN_API_KEY in the environment, requests need \"Authorization: Bearer KEY\" (else\n"
            "401), but for /health and /metrics.");
  args.option("--model", "DIR", "", "the model directory (this project's format or Hugging Face)")
      .option("--name", "NAME", "", "the model's id in the API (default: the directory's name)")
      .option("--host", "ADDR", "127.0.0.1", "address to listen on (loopback unless --allow-remote)")
      .flag("--allow-remote", "allow a --host that is not a loopback address (without --api-key there is no\n      authentication: whoever reaches the port can use the model)")
      .option("--api-key", "KEY", "",
              "requests must carry \"Authorization: Bearer KEY\" (else 401; /health and /metrics\n"
              "      are open); default: the environment's DIFFATTN_API_KEY, if set (which, unlike\n"
              "      this flag, other users cannot read in the process list)")
      .option("--port", "N", "8000", "port; 0 picks a free one (printed)")
      .option("--timeout", "S", "600", "a request's whole life in seconds (queue and generation): else 504")
      .option("--max-tokens", "N", "4096", "the largest max_tokens a request may ask for")
      .option("--max-body", "BYTES", "1048576", "the largest request body (else 413)")
      .option("--max-batch", "N", "64", "sequences in the running batch")
      .option("--max-waiting", "N", "256", "sequences waiting for the batch or KV blocks (more: 503)")
      .option("--kv-blocks", "N", "4096", "blocks in the KV pool")
      .option("--block-size", "N", "16", "KV positions per block")
      .option("--kv-dtype", "T", "f32",
              "the KV pool's storage: f32, bf16 or f16 (half the bytes, rounded once when\n"
              "      written; attention still computes in float32)")
      .option("--prefill-chunk", "N", "512", "prompt tokens prefilled per step, over all sequences")
      .flag("--no-prefix-cache",
            "compute every prompt in full (default: KV blocks of earlier prompts that begin the\n"
            "      same way are reused, whole or their first rows copied, least recently used evicted\n"
            "      first)")
      .option("--workers", "N", "128", "connections served at once (each stream holds one)")
      .option("--tokenizer", "WHICH", "model",
              "model: the directory's tokenizer (a Hugging Face directory must have one); bytes: raw "
              "bytes as token ids");
  if (!args.parse(argv)) return 0;
  if (!args.given("--model")) throw UsageError("--model DIR is required");
  serve::ServerOptions o;
  o.model_dir = args.str("--model");
  o.model_name = args.str("--name");
  o.host = args.str("--host");
  o.allow_remote = args.on("--allow-remote");
  if (!o.allow_remote && !http::is_loopback(o.host)) {  // before the model is loaded
    throw UsageError("--host must be a loopback address (127.0.0.1, ::1 or localhost) unless "
                     "--allow-remote is given, got \"" + o.host + "\"");
  }
  o.api_key = args.str("--api-key");
  if (!args.given("--api-key")) {
    const char* env = std::getenv("DIFFATTN_API_KEY");
    if (env != nullptr) o.api_key = env;
  }
  if (args.given("--api-key") && o.api_key.empty()) throw UsageError("--api-key must not be empty");
  for (const char c : o.api_key) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      throw UsageError("the API key (--api-key or DIFFATTN_API_KEY) must be printable ASCII without spaces");
    }
  }
  o.port = static_cast<int>(args.integer("--port", 0, 65535));
  o.timeout_seconds = static_cast<int>(args.integer("--timeout", 1, 86400));
  o.api.max_tokens = args.integer("--max-tokens", 1, 1 << 20);
  o.max_body_bytes = static_cast<size_t>(args.integer("--max-body", 1024, int64_t{1} << 30));
  o.engine.max_batch = args.integer("--max-batch", 1, 4096);
  o.engine.max_waiting = args.integer("--max-waiting", 0, 1 << 20);
  o.engine.n_blocks = args.integer("--kv-blocks", 1, int64_t{1} << 30);
  o.engine.block_size = args.integer("--block-size", 1, 4096);
  o.engine.kv_dtype = from_flags([&] { return parse_dtype(args.str("--kv-dtype"), "--kv-dtype"); });
  o.engine.prefill_chunk = args.integer("--prefill-chunk", 1, 1 << 20);
  o.engine.prefix_cache = !args.on("--no-prefix-cache");
  o.workers = static_cast<int>(args.integer("--workers", 1, 4096));
  o.tokenizer = from_flags([&] { return data::parse_tokenizer_choice(args.str("--tokenizer"), "--tokenizer"); });
  serve::run_server(o, [](const std::string& host, int port) {
    const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    std::cout << "diffattn serve: listening on http://" << h << ":" << port
              << "/v1  (Ctrl-C stops it)" << std::endl;
  });
  std::cout << "diffattn serve: stopped" << std::endl;
  return 0;
}

const CommandRegistration reg({"serve", "an OpenAI-compatible HTTP server for a model", 49, run_serve});

}  // namespace

}  // namespace diffattn::cli
