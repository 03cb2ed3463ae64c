// A hardened HTTP/1.1 server on httplib, shared by the explorer (`diffattn explore`) and the
// OpenAI-compatible server (`diffattn serve`). What it guarantees (server.cpp has the details):
// whole-request deadlines (a client trickling bytes holds a worker for seconds, not for ever),
// bounded request line, headers and body, a bounded worker pool and queue (a connection beyond
// them is answered 503 at once), TCP_NODELAY on every connection, an idle connection closed after
// a while, an exclusive bind (a port in use is an IoError naming it), loopback only unless the
// caller allows more, and SIGINT / SIGTERM stopping it cleanly.
//
// Streaming: a handler may answer with httplib's chunked content provider; the provider runs on
// the connection's worker thread, its writes go through the same deadline (Limits::
// response_seconds from the first byte of the answer), and client_gone() tells it whether the
// client has closed the connection.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include <httplib.h>

namespace diffattn::http {

struct Limits {
  int workers = 32;             // connections served at once
  int queue = 32;               // more connections waiting for a worker; beyond: 503
  int idle_seconds = 5;         // a connection waiting for its (next) request
  int request_seconds = 5;      // from a request's first byte to its last: else 408
  int response_seconds = 10;    // for the client to take a whole response
  int keep_alive_requests = 100;
  size_t max_head_bytes = 64 * 1024;    // request line and headers: else 431
  size_t max_body_bytes = 16 * 1024;    // else 413
  size_t max_discard_bytes = 1 << 20;   // of a body over max_body_bytes read to answer 413
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;                 // 0: a free port
  bool allow_remote = false;    // false: host must be a loopback address
  std::string what = "the server";   // for messages: "the explorer"
  std::string remote_hint;      // how to allow a non-loopback host, for the error message
  Limits limits;
  // The JSON body of an error answer the server makes itself (408, 413, 431, 503, ...).
  std::function<std::string(int status, const std::string& message)> error_body;
  // Answers every request (any method and path). A body without Content-Length arrives empty.
  std::function<void(const httplib::Request&, httplib::Response&)> handler;
  // Called once listening, with the bound port.
  std::function<void(const std::string& host, int port)> ready;
  // Called on SIGINT / SIGTERM before the listener closes (and before connections are cut):
  // a server with streams in flight ends them here. May block briefly.
  std::function<void()> on_stop;
};

// Serves until SIGINT or SIGTERM (then returns normally). Throws InvalidArgument for a bad host
// or port, IoError when the port cannot be bound.
void serve(const Options& o);

// On a worker thread while it answers a request (a handler or a content provider): true when
// the client has closed its side of the connection or the connection failed.
bool client_gone();

bool is_loopback(const std::string& host);

}  // namespace diffattn::http
