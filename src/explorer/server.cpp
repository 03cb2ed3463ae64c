// The explorer's HTTP server: the shared hardened server (src/http/) with the explorer's limits
// (explorer.h), every request handed to the pure API (api.cpp).
#include <string>

#include "diffattn/explorer/explorer.h"
#include "diffattn/http/http_server.h"

namespace diffattn::explorer {

void serve(const std::string& host, int port, void (*ready)(const std::string& host, int port)) {
  http::Options o;
  o.host = host;
  o.port = port;
  o.what = "the explorer";
  o.limits.workers = kServerWorkers;
  o.limits.queue = kServerQueue;
  o.limits.idle_seconds = kIdleSeconds;
  o.limits.request_seconds = kRequestSeconds;
  o.limits.response_seconds = kResponseSeconds;
  o.limits.keep_alive_requests = kKeepAliveRequests;
  o.limits.max_head_bytes = kMaxHeadBytes;
  o.limits.max_body_bytes = kMaxBodyBytes;
  o.limits.max_discard_bytes = kMaxDiscardBytes;
  o.error_body = [](int status, const std::string& message) {
    return error_response(status, message).body;
  };
  o.handler = [](const httplib::Request& req, httplib::Response& res) {
    const Response r = handle(req.method, req.path, req.body);  // handle() checks the body's size
    res.status = r.status;
    res.set_content(r.body, r.content_type.c_str());
  };
  o.ready = ready;
  http::serve(o);
}

}  // namespace diffattn::explorer
