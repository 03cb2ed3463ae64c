// The explorer's HTTP server: httplib on a loopback address, every request handed to the pure
// API (api.cpp). SIGINT and SIGTERM only write to a pipe; a thread reading it stops the server,
// so no work happens inside a signal handler.
#include <arpa/inet.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <httplib.h>

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

int g_stop_pipe[2] = {-1, -1};

volatile sig_atomic_t g_signalled = 0;  // set by a real signal, not by the wake-up below

void on_stop_signal(int sig) {
  if (sig != 0) g_signalled = 1;
  const char c = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_stop_pipe[1], &c, 1);
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
  // SIGINT and SIGTERM write a byte to a pipe (the only thing a handler may safely do); a
  // thread waiting on the pipe stops the server. Any thread may receive the signal.
  if (::pipe(g_stop_pipe) != 0) throw IoError("cannot create the explorer's stop pipe");
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_signalled = 0;
  std::thread stopper([&svr] {
    char c = 0;
    while (::read(g_stop_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    svr.stop();
  });
  ready(host, bound);
  const bool ok = svr.listen_after_bind();
  on_stop_signal(0);  // the server may have ended by itself: wake the stopper either way
  stopper.join();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  ::close(g_stop_pipe[0]);
  ::close(g_stop_pipe[1]);
  // A stop that comes before listening starts makes listen fail: that is still a clean stop.
  if (!ok && !g_signalled) throw IoError("the server on " + host + ":" + std::to_string(bound) + " stopped with an error");
}

}  // namespace diffattn::explorer
