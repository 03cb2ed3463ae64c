// The explorer's HTTP server: httplib on a loopback address, every request handed to the pure
// API (api.cpp). SIGINT and SIGTERM are taken by a thread (sigwait), which stops the server, so
// no work happens inside a signal handler.
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>

#include <httplib.h>

#include <atomic>
#include <thread>

#include "diffattn/error.h"
#include "diffattn/explorer.h"

namespace diffattn::explorer {

namespace {

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

void answer(const httplib::Request& req, httplib::Response& res) {
  const Response r = handle(req.method, req.path, req.body);
  res.status = r.status;
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_content(r.body, r.content_type.c_str());
}

}  // namespace

void serve(const std::string& host, int port, void (*ready)(const std::string& host, int port)) {
  if (!is_loopback(host)) {
    throw InvalidArgument("--host must be a loopback address (127.0.0.1, ::1 or localhost): the "
                          "explorer is for this machine only, got \"" + host + "\"");
  }
  if (port < 0 || port > 65535) {
    throw InvalidArgument("--port must be 0..65535, got " + std::to_string(port));
  }
  // Block the stop signals in every thread (httplib's workers inherit the mask); one thread
  // waits for them.
  sigset_t stop_set;
  sigemptyset(&stop_set);
  sigaddset(&stop_set, SIGINT);
  sigaddset(&stop_set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_set, nullptr);

  httplib::Server svr;
  svr.set_payload_max_length(kMaxBodyBytes);
  svr.set_read_timeout(10, 0);
  svr.set_write_timeout(10, 0);
  svr.set_keep_alive_max_count(100);
  svr.Get(".*", answer);
  svr.Post(".*", answer);
  svr.Put(".*", answer);
  svr.Delete(".*", answer);
  svr.Patch(".*", answer);
  // Statuses httplib decides itself (413 for a body over the limit, 400 for a malformed request)
  // get a JSON body too.
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 413
                                ? "the body is larger than " + std::to_string(kMaxBodyBytes) + " bytes"
                                : "request rejected (HTTP " + std::to_string(res.status) + ")";
    const Response r = error_response(res.status, msg);
    res.set_content(r.body, r.content_type.c_str());
  });
  int bound = port;
  if (port == 0) {
    bound = svr.bind_to_any_port(host.c_str());
  } else if (!svr.bind_to_port(host.c_str(), port)) {
    bound = -1;
  }
  if (bound <= 0) {
    throw IoError("cannot listen on " + host + ":" + std::to_string(port) +
                  " (in use, or not an address of this machine)");
  }
  std::atomic<bool> signalled{false};
  std::thread stopper([&svr, &signalled, stop_set] {
    int sig = 0;
    sigwait(&stop_set, &sig);
    signalled = true;
    svr.stop();
  });
  ready(host, bound);
  const bool ok = svr.listen_after_bind();
  // The server ended by itself: wake the stopper, still in sigwait, which consumes the signal.
  // (The stop signals stay blocked: the process is about to return from the command.)
  if (!signalled) pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  if (!ok) throw IoError("the server on " + host + ":" + std::to_string(bound) + " stopped with an error");
}

}  // namespace diffattn::explorer
