// The explorer behind `diffattn explore`: a JSON API over the library and a page (plain HTML, JS
// and CSS compiled into the binary) that draws the four views of a head, a lambda slider and
// the distribution of a clicked row. The API is a pure function of (method, path, body), so it
// is tested without a network; the server only moves bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace diffattn::explorer {

// Bounds on what a request may ask for; anything larger is a 400 (413 for the body).
inline constexpr size_t kMaxBodyBytes = 16 * 1024;
inline constexpr int64_t kMaxLength = 64;      // tokens of a random example
inline constexpr int64_t kMaxHeadDim = 64;
inline constexpr size_t kMaxPromptBytes = 2048;  // a model's prompt, in bytes
inline constexpr int64_t kMaxPromptTokens = 96;  // ... and in tokens (T x T maps go back as JSON)
inline constexpr double kMaxAbsLambda = 4.0;

// The HTTP server's limits (server.cpp; `diffattn explore --help` lists them). A connection is
// served by one of kServerWorkers threads; up to kServerQueue more wait for one; a connection
// beyond that is answered 503 at once and closed. Deadlines are for whole requests, not single
// reads, so a client trickling bytes cannot hold a worker.
inline constexpr int kServerWorkers = 32;
inline constexpr int kServerQueue = 32;
inline constexpr int kIdleSeconds = 5;       // a connection waiting for its (next) request
inline constexpr int kRequestSeconds = 5;    // from a request's first byte to its last: else 408
inline constexpr int kResponseSeconds = 10;  // for the client to take a whole response
inline constexpr int kKeepAliveRequests = 100;        // requests on one connection
inline constexpr size_t kMaxHeadBytes = 64 * 1024;    // request line and headers
inline constexpr size_t kMaxDiscardBytes = 1 << 20;   // of a body over kMaxBodyBytes read to
                                                      // answer 413; beyond, the connection closes

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// GET  /                  the page; /app.js, /style.css its parts
// GET  /api/info          sources, limits and defaults
// POST /api/views         {"source": "textbook" | "random", "lambda": 0.4,
//                          "mode": "signed" | "clamp", "causal": false,
//                          "length": 12, "head_dim": 4, "seed": 0}   (length .. seed: random only)
//                         -> {"tokens": [...], "views": {"map1", "map2", "diff", "standard"}
//                             as T x T arrays, "outputs": {"diff", "standard"} as T x Dv, ...}
//                         {"source": "model", "model": 0, "prompt": "...", "layer": 0,
//                          "head": 0 (-1: mean of the heads), "lambda": optional (absent: the
//                          model's learned lambda), "mode"}
//                         -> the same "views", recomputed from the saved lse of the model's fused
//                            forward (inspect.h); a standard model has only "standard" (the
//                            others are null); no "outputs".
// Bad input: 400 with {"error": "..."} naming the field; unknown paths 404; wrong methods 405.
Response handle(const std::string& method, const std::string& path, const std::string& body);

// Offers a saved model (a directory of FORMAT.md) as the source "model", numbered in the order
// added; /api/info lists them. Throws what load_model throws. A model is shared read only: each
// request runs its forward in its own TrainContext, so requests need no lock.
void add_model(const std::string& dir);

// {"error": message} with the status.
Response error_response(int status, const std::string& message);

// Serves on host:port until SIGINT or SIGTERM. host must be a loopback address (127.0.0.0/8,
// ::1 or "localhost"); port 0 picks a free port. Calls ready(port) once listening. The port is
// bound exclusively (no SO_REUSEPORT): a port in use is an IoError naming it.
void serve(const std::string& host, int port, void (*ready)(const std::string& host, int port));

}  // namespace diffattn::explorer
