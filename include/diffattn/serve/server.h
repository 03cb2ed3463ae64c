// `diffattn serve`: an OpenAI-compatible HTTP server over one model (server.cpp), on the shared
// hardened HTTP server (src/http/) and the continuous-batching scheduler (infer/scheduler.h).
//
//   POST /v1/completions        {"prompt": "..." | [ids], "max_tokens", "temperature", "top_p",
//                                "top_k", "seed", "stop", "n", "stream", "stream_options"}
//   POST /v1/chat/completions   {"messages": [{"role", "content"}], ... the same}
//   POST /tokenize              {"prompt"} or {"messages"} -> {"tokens", "count", "max_model_len"}
//   POST /detokenize            {"tokens"} -> {"prompt"}
//   GET  /v1/models             the one model
//   GET  /health                {"status": "ok"}
//   GET  /metrics               Prometheus text
// Errors are OpenAI error objects: 400 bad request, 401 without the --api-key, 404 unknown path or model, 405 wrong method,
// 413 body too large, 503 queue full or shutting down, 504 past the request's timeout.
#pragma once

#include <functional>
#include <string>

#include "diffattn/data/data.h"
#include "diffattn/infer/scheduler.h"
#include "serve/openai.h"

namespace diffattn::serve {

struct ServerOptions {
  std::string model_dir;
  std::string model_name;  // empty: the directory's last component
  std::string host = "127.0.0.1";
  int port = 8000;
  bool allow_remote = false;
  int timeout_seconds = 600;          // a request's whole life: queue, prefill, generation
  size_t max_body_bytes = 1 << 20;
  int workers = 128;                  // connections served at once (each stream holds one)
  int queue = 64;                     // connections waiting for a worker
  infer::SchedulerOptions engine;
  ApiLimits api;
  data::TokenizerChoice tokenizer = data::TokenizerChoice::kModel;
  // Non-empty: every request but /health and /metrics needs "Authorization: Bearer api_key"
  // (else 401).
  std::string api_key;
};

// Loads the model and serves until SIGINT / SIGTERM, which cancel what is in flight (streams end
// with an error event and [DONE]) and return normally. ready(host, port) once listening.
void run_server(const ServerOptions& o, const std::function<void(const std::string&, int)>& ready);

}  // namespace diffattn::serve
