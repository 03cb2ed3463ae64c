// The shared HTTP server (http_server.h): httplib on a loopback address (another only when the
// caller allows it), every request handed to the caller's handler. SIGINT and SIGTERM only write to a pipe; a thread reading it stops the server,
// so no work happens inside a signal handler.
//
// Hardening on top of httplib 0.11 (whose own limits are per read() call, with a worker pool
// that queues connections without bound):
// - every connection is read and written through ConnectionStream, which bounds a whole request
//   (g_opt->limits.request_seconds from its first byte to its last, g_opt->limits.max_head_bytes of request line and headers,
//   g_opt->limits.max_discard_bytes of an oversized body) and a whole response (g_opt->limits.response_seconds), so a client
//   trickling bytes holds a worker for seconds, not for ever; a request that runs out of time
//   is answered 408 and its connection closed;
// - HardenedServer replaces httplib's per-connection loop (process_and_close_socket) with one
//   that sets TCP_NODELAY on the accepted socket (httplib writes the headers and the body in two
//   send() calls: with Nagle's algorithm the second waits for the client's delayed ACK, about
//   40 ms per keep-alive response), waits g_opt->limits.idle_seconds at most for a connection's next request
//   and serves g_opt->limits.keep_alive_requests per connection at most;
// - BoundedPool is the task queue: g_opt->limits.workers threads and g_opt->limits.queue waiting connections;
//   a connection beyond those is answered 503 on the accepting thread and closed;
// - the listen backlog is 128, not httplib's 5 (a burst of connections lost SYNs: 1 s stalls);
// - the listening socket gets SO_REUSEADDR only (httplib's default sets SO_REUSEPORT, which lets
//   a second server bind the same port and take half of its connections);
// - every request head is read whole and checked against RFC 9112's framing (request_head.h)
//   before httplib parses it: a head that a second parser could read differently (two
//   Content-Lengths, Transfer-Encoding with Content-Length, whitespace before a colon, control
//   bytes, line folding, bare CR or LF) is answered 400 and its connection closed, so nothing
//   sent after it on the connection is ever answered; so is every error httplib answers itself.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <httplib.h>

#include "diffattn/base/error.h"
#include "diffattn/http/http_server.h"
#include "http/request_head.h"

namespace diffattn::http {

namespace {

using Clock = std::chrono::steady_clock;

// The options of the one server running in this process (serve() sets it).
const Options* g_opt = nullptr;

int g_stop_pipe[2] = {-1, -1};

volatile sig_atomic_t g_signalled = 0;  // set by a real signal, not by the wake-up below

void on_stop_signal(int sig) {
  if (sig != 0) g_signalled = 1;
  const char c = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_stop_pipe[1], &c, 1);
}

// Waits are cut into slices so that a stopping server (its listening socket closed) is noticed
// within one slice by every connection.
constexpr int kPollSliceMs = 200;

// Connections the kernel holds for the accepting thread (each is then served, queued or refused
// at once).
constexpr int kListenBacklog = 128;

enum class Wait { kReady, kTimeout, kStopped, kError };

// Waits until fd is ready for `events`, the deadline passes or the server stops. kReady includes
// a hang-up or an error on fd: the following recv/send reports it.
Wait wait_for(int fd, short events, Clock::time_point deadline,
              const std::atomic<socket_t>& listener) {
  for (;;) {
    if (listener == INVALID_SOCKET) return Wait::kStopped;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Wait::kTimeout;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, kPollSliceMs)));
    if (n > 0) return Wait::kReady;
    if (n < 0 && errno != EINTR) return Wait::kError;
  }
}

std::string address_string(const sockaddr_storage& a, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    port = ntohs(v6->sin6_port);
  } else {
    port = 0;
  }
  return text;
}

// One connection's byte stream, as httplib's request parser and response writer see it.
// begin_request() starts a request's budget: g_opt->limits.request_seconds and g_opt->limits.max_head_bytes for reading it
// (g_opt->limits.max_discard_bytes of body), then g_opt->limits.response_seconds from the first byte of the answer. A read
// past a limit fails (-1), and timed_out() / over_limit() say why; httplib then answers 400 or
// nothing, which the connection loop and the error handler turn into 408 or 431.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, const std::atomic<socket_t>& listener)
      : fd_(fd), listener_(listener), buf_(16 * 1024) {}

  void begin_request() {
    read_deadline_ = Clock::now() + std::chrono::seconds(g_opt->limits.request_seconds);
    writing_ = false;
    head_done_ = false;
    crlfcrlf_ = 0;
    head_bytes_ = body_bytes_ = written_ = skipped_ = 0;
    timed_out_ = over_limit_ = close_after_ = false;
  }

  bool has_buffered() const { return off_ < len_; }

  enum class Head { kReady, kClosed, kTimeout, kTooLarge };
  // Buffers the next request's head (from its request line to the blank line that ends it,
  // after skipping empty lines before it), within the request's deadline and max_head_bytes;
  // on kReady, head views it in the buffer, where httplib will read it from.
  Head read_head(std::string_view& head) {
    size_t scanned = 0;  // bytes after off_ known to hold no CRLF CRLF
    for (;;) {
      while (len_ - off_ >= 2 && buf_[off_] == '\r' && buf_[off_ + 1] == '\n') {
        off_ += 2;  // an empty line before the request line (RFC 9112 2.2)
        skipped_ += 2;
        scanned = 0;
      }
      const std::string_view have(buf_.data() + off_, len_ - off_);
      const size_t end = have.find("\r\n\r\n", scanned);
      if (end != std::string_view::npos) {
        head = have.substr(0, end + 4);
        return Head::kReady;
      }
      scanned = have.size() >= 3 ? have.size() - 3 : 0;
      if (have.size() + skipped_ > g_opt->limits.max_head_bytes) {
        over_limit_ = true;
        return Head::kTooLarge;
      }
      // More bytes: keep the buffered ones at the front, room for a whole head behind them.
      if (off_ > 0) {
        std::memmove(buf_.data(), buf_.data() + off_, len_ - off_);
        len_ -= off_;
        off_ = 0;
      }
      if (buf_.size() - len_ < 4096) buf_.resize(std::max(buf_.size() * 2, len_ + 16 * 1024));
      const Wait w = wait_for(fd_, POLLIN, read_deadline_, listener_);
      if (w == Wait::kTimeout) {
        timed_out_ = true;
        return Head::kTimeout;
      }
      if (w != Wait::kReady) return Head::kClosed;
      const ssize_t n = ::recv(fd_, buf_.data() + len_, buf_.size() - len_, MSG_DONTWAIT);
      if (n == 0) return Head::kClosed;
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return Head::kClosed;
      }
      len_ += static_cast<size_t>(n);
    }
  }
  // Bytes of the request read so far (head included): any at all means the client began one.
  bool began() const { return skipped_ > 0 || len_ > off_; }
  bool timed_out() const { return timed_out_; }
  bool over_limit() const { return over_limit_; }
  bool head_over_limit() const { return over_limit_ && !head_done_; }
  // The request is answered without reading its body: the connection must close after it.
  void close_after() { close_after_ = true; }
  bool must_close() const { return timed_out_ || over_limit_ || close_after_; }
  size_t written() const { return written_; }

  bool is_readable() const override {
    return has_buffered() || wait_for(fd_, POLLIN, read_deadline_, listener_) == Wait::kReady;
  }

  bool is_writable() const override {
    const Clock::time_point deadline =
        writing_ ? write_deadline_ : Clock::now() + std::chrono::seconds(g_opt->limits.response_seconds);
    return wait_for(fd_, POLLOUT, deadline, listener_) == Wait::kReady;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (timed_out_ || over_limit_) return -1;
    if (!has_buffered()) {
      ssize_t n = -1;
      for (;;) {
        const Wait w = wait_for(fd_, POLLIN, read_deadline_, listener_);
        if (w == Wait::kTimeout) timed_out_ = true;
        if (w != Wait::kReady) return -1;
        n = ::recv(fd_, buf_.data(), buf_.size(), MSG_DONTWAIT);
        if (n >= 0) break;
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      }
      if (n == 0) return 0;  // the client closed its side
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, len_ - off_);
    // Until the blank line that ends the headers, bytes count against g_opt->limits.max_head_bytes; after it,
    // against g_opt->limits.max_discard_bytes (httplib itself answers 413 to a body over g_opt->limits.max_body_bytes, after
    // reading it).
    size_t head = 0;
    while (!head_done_ && head < n) {
      const char c = buf_[off_ + head++];
      crlfcrlf_ = c == "\r\n\r\n"[crlfcrlf_] ? crlfcrlf_ + 1 : (c == '\r' ? 1 : 0);
      head_done_ = crlfcrlf_ == 4;
    }
    head_bytes_ += head;
    body_bytes_ += n - head;
    if (head_bytes_ > g_opt->limits.max_head_bytes || body_bytes_ > g_opt->limits.max_discard_bytes) {
      over_limit_ = true;
      return -1;
    }
    std::memcpy(ptr, buf_.data() + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!writing_) {
      writing_ = true;
      // An answer to a request that ran out of time gets a short while: its client is slow.
      write_deadline_ = Clock::now() + (timed_out_ ? std::chrono::seconds(1)
                                                   : std::chrono::seconds(g_opt->limits.response_seconds));
    }
    for (;;) {
      if (wait_for(fd_, POLLOUT, write_deadline_, listener_) != Wait::kReady) return -1;
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) {
        written_ += static_cast<size_t>(n);
        return n;
      }
      if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    port = 0;
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip = address_string(a, port);
  }

  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    port = 0;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip = address_string(a, port);
  }

  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  const std::atomic<socket_t>& listener_;
  std::vector<char> buf_;  // read ahead; kept across the requests of a connection (pipelining)
  size_t off_ = 0, len_ = 0;
  Clock::time_point read_deadline_ = Clock::now() + std::chrono::seconds(g_opt->limits.request_seconds);
  Clock::time_point write_deadline_{};
  bool writing_ = false;
  bool head_done_ = false;
  int crlfcrlf_ = 0;  // how much of "\r\n\r\n" the last bytes read matched
  size_t head_bytes_ = 0, body_bytes_ = 0, written_ = 0;
  size_t skipped_ = 0;  // empty lines before this request's request line
  bool timed_out_ = false, over_limit_ = false, close_after_ = false;
};

// The stream of the request a worker thread is serving (for the error handler), and whether the
// accepting thread is running a connection's task itself to refuse it.
thread_local ConnectionStream* t_stream = nullptr;
thread_local bool t_refuse = false;

std::string timeout_message() {
  return "the request did not arrive within " + std::to_string(g_opt->limits.request_seconds) +
         " s of its first byte";
}

std::string head_limit_message() {
  return "the request line and headers are larger than " + std::to_string(g_opt->limits.max_head_bytes) +
         " bytes";
}

// A whole response written by hand, for the cases httplib does not answer itself.
std::string raw_response(int status, const char* reason, const std::string& message,
                         const char* extra_headers = "") {
  const std::string body = g_opt->error_body(status, message);
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n" + extra_headers +
         "Connection: close\r\n\r\n" + body;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 431: return "Request Header Fields Too Large";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

// Reads and drops what the client has sent, waiting up to wait_ms for the first bytes, so that
// closing the socket does not reset the connection before the client reads our answer.
void drain(int fd, int wait_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return;
  char scratch[4096];
  for (size_t total = 0; total < g_opt->limits.max_head_bytes;) {
    const ssize_t n = ::recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
    if (n <= 0) return;
    total += static_cast<size_t>(n);
  }
}

// g_opt->limits.workers threads serve connections; g_opt->limits.queue more connections wait for one. A
// connection beyond that is refused: its task runs at once on the accepting thread with
// t_refuse set, which answers 503 (at most ~100 ms: accepting slows down while overloaded).
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool() {
    for (int i = 0; i < g_opt->limits.workers; ++i) threads_.emplace_back([this] { work(); });
  }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopping_ && busy_ + jobs_.size() < static_cast<size_t>(g_opt->limits.workers + g_opt->limits.queue)) {
        jobs_.push_back(std::move(fn));
        ready_.notify_one();
        return;
      }
    }
    t_refuse = true;
    fn();
    t_refuse = false;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : threads_) t.join();  // queued connections are closed, not served
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        ++busy_;
      }
      fn();
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  size_t busy_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

class HardenedServer final : public httplib::Server {
 public:
  // httplib listens with a backlog of 5: a burst of connections (a browser opens six at once)
  // on a busy machine overflows it, and each dropped SYN costs its client a 1 s retransmit.
  // listen() again on the bound socket only changes the backlog.
  void widen_backlog(int backlog) {
    if (::listen(svr_sock_, backlog) != 0) {
      throw IoError(std::string("cannot listen on " + g_opt->what + "'s socket: ") + std::strerror(errno));
    }
  }

 private:
  // Overrides httplib's per-connection loop (a private virtual of httplib::Server): called for
  // each accepted socket, on a worker of BoundedPool (or on the accepting thread to refuse it).
  bool process_and_close_socket(socket_t sock) override {
    bool ok = false;
    try {
      if (t_refuse) {
        refuse(sock);
      } else {
        ok = serve_connection(sock);
      }
    } catch (...) {  // nothing may escape into httplib's threads; the connection just closes
      t_stream = nullptr;
      ok = false;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  bool serve_connection(int sock) {
    const int yes = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    ConnectionStream strm(sock, svr_sock_);
    bool ok = true;
    // Writes a whole answer of our own; the connection closes after it.
    auto answer_and_close = [&](int status, const std::string& message) {
      const std::string r = raw_response(status, reason_phrase(status), message);
      for (size_t at = 0; at < r.size();) {
        const ssize_t n = strm.write(r.data() + at, r.size() - at);
        if (n < 0) break;
        at += static_cast<size_t>(n);
      }
      strm.close_after();
    };
    for (int served = 0; served < g_opt->limits.keep_alive_requests && svr_sock_ != INVALID_SOCKET; ++served) {
      if (!strm.has_buffered() &&
          wait_for(sock, POLLIN, Clock::now() + std::chrono::seconds(g_opt->limits.idle_seconds), svr_sock_) !=
              Wait::kReady) {
        break;  // idle too long, or the server is stopping
      }
      strm.begin_request();
      // The head, whole, checked before httplib parses a byte of it.
      std::string_view head;
      const ConnectionStream::Head got = strm.read_head(head);
      if (got == ConnectionStream::Head::kClosed) break;  // nothing (more) was asked
      if (got == ConnectionStream::Head::kTimeout) {
        answer_and_close(408, timeout_message());
        break;
      }
      if (got == ConnectionStream::Head::kTooLarge) {
        answer_and_close(431, head_limit_message());
        break;
      }
      const HeadCheck check = check_request_head(head);
      if (check.status != 0) {
        answer_and_close(check.status, check.message);
        break;
      }
      bool client_closes = false;
      t_stream = &strm;
      ok = process_request(strm, served + 1 == g_opt->limits.keep_alive_requests, client_closes, nullptr);
      t_stream = nullptr;
      if (strm.written() == 0 && (strm.timed_out() || strm.head_over_limit())) {
        // httplib gives up silently when the request line itself is cut short: answer here.
        const std::string r = strm.timed_out()
                                  ? raw_response(408, "Request Timeout", timeout_message())
                                  : raw_response(431, "Request Header Fields Too Large",
                                                 head_limit_message());
        for (size_t at = 0; at < r.size();) {
          const ssize_t n = strm.write(r.data() + at, r.size() - at);
          if (n < 0) break;
          at += static_cast<size_t>(n);
        }
      }
      if (!ok || client_closes || strm.must_close()) break;
    }
    if (strm.must_close()) {
      // Refused or cut short: what the client sent after it is dropped unread, but closing with
      // unread bytes would reset the connection and could take our answer with it.
      ::shutdown(sock, SHUT_WR);
      drain(sock, 100);
    }
    return ok;
  }

  static void refuse(int sock) {
    drain(sock, 100);
    const std::string r = raw_response(
        503, "Service Unavailable",
        g_opt->what + " is busy: " + std::to_string(g_opt->limits.workers + g_opt->limits.queue) +
            " connections are open, the most it takes; try again in a moment",
        "Retry-After: 1\r\n");
    [[maybe_unused]] const ssize_t n = ::send(sock, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(sock, SHUT_WR);
    drain(sock, 0);
  }
};

void put_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(g_opt->error_body(status, message), "application/json");
}

void answer(const httplib::Request& req, httplib::Response& res) {
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Content-Type-Options", "nosniff");
  g_opt->handler(req, res);
}

// Runs after the headers, before httplib reads a body, whose size httplib bounds only by its
// Content-Length: a chunked body would be read without bound, and an encoded one (gzip,
// deflate, br) decompressed without bound. Clients send neither, so both are refused unread;
// a body without Content-Length (which httplib would read until the client closes) is empty.
httplib::Server::HandlerResponse before_body(const httplib::Request& req,
                                             httplib::Response& res) {
  const bool has_body = req.method == "POST" || req.method == "PUT" ||
                        req.method == "PATCH" || req.method == "DELETE" || req.method == "PRI";
  if (!has_body) {
    // A body httplib does not read would be parsed as the next request: close after this one.
    if (t_stream != nullptr && (req.has_header("Transfer-Encoding") ||
                                (req.has_header("Content-Length") &&
                                 req.get_header_value("Content-Length") != "0"))) {
      t_stream->close_after();
      res.set_header("Connection", "close");
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }
  std::string refusal;
  int status = 0;
  if (req.has_header("Transfer-Encoding")) {
    status = 411;
    refusal = "a request body must come with a Content-Length, not a Transfer-Encoding";
  } else if (req.has_header("Content-Encoding") &&
             req.get_header_value("Content-Encoding") != "identity") {
    status = 415;
    refusal = "a request body must not be compressed (Content-Encoding)";
  }
  if (status != 0) {
    if (t_stream != nullptr) t_stream->close_after();
    res.set_header("Connection", "close");
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Content-Type-Options", "nosniff");
    put_error(res, status, refusal);
    return httplib::Server::HandlerResponse::Handled;
  }
  if (!req.has_header("Content-Length")) {
    httplib::Request empty = req;
    empty.body.clear();
    answer(empty, res);
    return httplib::Server::HandlerResponse::Handled;
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

}  // namespace

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

bool client_gone() {
  if (t_stream == nullptr) return false;
  pollfd p{t_stream->socket(), static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  if ((p.revents & POLLIN) != 0) {
    char c = 0;
    const ssize_t n = ::recv(t_stream->socket(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

void serve(const Options& o) {
  const std::string& host = o.host;
  const int port = o.port;
  if (!o.allow_remote && !is_loopback(host)) {
    throw InvalidArgument("--host must be a loopback address (127.0.0.1, ::1 or localhost): " +
                          o.what + " is for this machine only" + o.remote_hint + ", got \"" +
                          host + "\"");
  }
  if (!o.handler || !o.error_body) throw InvalidArgument("http::serve: no handler");
  g_opt = &o;
  if (port < 0 || port > 65535) {
    throw InvalidArgument("--port must be 0..65535, got " + std::to_string(port));
  }
  HardenedServer svr;
  svr.new_task_queue = [] { return new BoundedPool; };
  svr.set_socket_options([](socket_t sock) {
    // Exclusive: SO_REUSEADDR lets a restarted server take a port whose old connections are in
    // TIME_WAIT, but (unlike SO_REUSEPORT) never one that another socket listens on.
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  svr.set_tcp_nodelay(true);
  svr.set_payload_max_length(g_opt->limits.max_body_bytes);
  // Backstops for a single blocking call; ConnectionStream's deadlines are what bind a request.
  svr.set_read_timeout(g_opt->limits.request_seconds, 0);
  svr.set_write_timeout(g_opt->limits.response_seconds, 0);
  // Announced in each response's Keep-Alive header; the loop in HardenedServer enforces them.
  svr.set_keep_alive_max_count(g_opt->limits.keep_alive_requests);
  svr.set_keep_alive_timeout(g_opt->limits.idle_seconds);
  svr.set_pre_routing_handler(before_body);
  svr.Get(".*", answer);
  svr.Post(".*", answer);
  svr.Put(".*", answer);
  svr.Delete(".*", answer);
  svr.Patch(".*", answer);
  // Statuses httplib decides itself (413 for a body over the limit, 400 for a malformed request)
  // get a JSON body too; a request cut off by its deadline or the header limit becomes 408/431.
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    if (t_stream != nullptr && t_stream->timed_out()) {
      res.status = 408;
      msg = timeout_message();
    } else if (t_stream != nullptr && t_stream->head_over_limit()) {
      res.status = 431;
      msg = head_limit_message();
    } else if (res.status == 413) {
      msg = "the body is larger than " + std::to_string(g_opt->limits.max_body_bytes) + " bytes";
    } else {
      msg = "request rejected (HTTP " + std::to_string(res.status) + ")";
    }
    // An error httplib found itself (a request it could not parse, a body over the limit): the
    // connection's framing is in doubt, so it closes after this answer.
    if (t_stream != nullptr) t_stream->close_after();
    res.set_header("Connection", "close");  // the connection loop closes it after this answer
    res.set_content(g_opt->error_body(res.status, msg), "application/json");
  });
  int bound = port;
  errno = 0;
  if (port == 0) {
    bound = svr.bind_to_any_port(host.c_str());
  } else if (!svr.bind_to_port(host.c_str(), port)) {
    bound = -1;
  }
  if (bound <= 0) {
    const int err = errno;
    const std::string where = (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                              ":" + std::to_string(port);
    if (err == EADDRINUSE) {
      throw IoError("cannot listen on " + where + ": port " + std::to_string(port) +
                    " is already in use (another server?); choose another with --port N, "
                    "or --port 0 for a free one");
    }
    throw IoError("cannot listen on " + where + " (" +
                  (err != 0 ? std::string(std::strerror(err)) : std::string("no such address")) +
                  "; is it an address of this machine?)");
  }
  svr.widen_backlog(kListenBacklog);
  // SIGINT and SIGTERM write a byte to a pipe (the only thing a handler may safely do); a
  // thread waiting on the pipe stops the server. Any thread may receive the signal.
  if (::pipe(g_stop_pipe) != 0) throw IoError("cannot create " + o.what + "'s stop pipe");
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_signalled = 0;
  std::atomic<bool> listen_returned{false};
  std::thread stopper([&svr, &listen_returned, &o] {
    char c = 0;
    while (::read(g_stop_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    if (g_signalled && o.on_stop) {
      try {
        o.on_stop();
      } catch (...) {  // stopping goes on regardless
      }
    }
    // httplib's stop() does nothing before listening has begun (and must not be called twice
    // while it runs): wait for one or the other.
    while (!listen_returned) {
      if (svr.is_running()) {
        svr.stop();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  if (o.ready) o.ready(host, bound);
  const bool ok = svr.listen_after_bind();
  listen_returned = true;
  on_stop_signal(0);  // the server may have ended by itself: wake the stopper either way
  stopper.join();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  ::close(g_stop_pipe[0]);
  ::close(g_stop_pipe[1]);
  if (!ok && !g_signalled) {
    throw IoError("the server on " + host + ":" + std::to_string(bound) + " stopped with an error");
  }
}

}  // namespace diffattn::http
