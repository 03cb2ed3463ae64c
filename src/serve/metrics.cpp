// /metrics of `diffattn serve` (server_impl.h): requests by endpoint and status, the engine's
// counters and gauges, time-to-first-token and request-duration histograms (Prometheus text).
#include "serve/server_impl.h"

namespace diffattn::serve {

void Server::count(const std::string& path, int status) {
  const std::string ep = path == "/v1/completions" || path == "/v1/chat/completions" ||
                                 path == "/v1/models" || path == "/health" || path == "/metrics" ||
                                 path == "/tokenize" || path == "/detokenize"
                             ? path
                             : "other";
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{ep, status}];
}

std::string Server::metrics() {
  const infer::SchedulerStats s = engine_->stats();
  std::string out;
  auto gauge = [&](const std::string& name, const std::string& type, const std::string& help, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + buf + "\n";
  };
  std::lock_guard<std::mutex> lock(mu_);
  out += "# HELP diffattn_requests_total HTTP requests answered, by endpoint and status\n"
         "# TYPE diffattn_requests_total counter\n";
  for (const auto& [k, n] : requests_) {
    out += "diffattn_requests_total{endpoint=\"" + k.first + "\",status=\"" +
           std::to_string(k.second) + "\"} " + std::to_string(n) + "\n";
  }
  gauge("diffattn_prompt_tokens_total", "counter", "prompt tokens prefilled", static_cast<double>(s.prompt_tokens));
  gauge("diffattn_prefix_cache_hit_tokens_total", "counter", "prompt tokens whose K/V came from the prefix cache",
        static_cast<double>(s.cached_prompt_tokens));
  gauge("diffattn_kv_blocks_cached", "gauge", "KV blocks registered in the prefix cache (in use or free)",
        static_cast<double>(s.cached_blocks));
  gauge("diffattn_generation_tokens_total", "counter", "tokens generated", static_cast<double>(s.generated_tokens));
  gauge("diffattn_engine_steps_total", "counter", "scheduler steps run", static_cast<double>(s.steps));
  gauge("diffattn_queue_depth", "gauge", "sequences waiting to be admitted", static_cast<double>(s.waiting));
  gauge("diffattn_running_sequences", "gauge", "sequences in the running batch", static_cast<double>(s.running));
  gauge("diffattn_batch_size", "gauge", "sequences advanced by the last step", s.last_batch);
  gauge("diffattn_kv_blocks_free", "gauge", "free blocks of the KV pool", static_cast<double>(s.free_blocks));
  gauge("diffattn_kv_blocks_total", "gauge", "blocks of the KV pool", static_cast<double>(s.total_blocks));
  gauge("diffattn_kv_block_size", "gauge", "KV positions per block", static_cast<double>(engine_->options().block_size));
  ttft_.write(out, "diffattn_time_to_first_token_seconds", "time from a request's arrival to its first token");
  latency_.write(out, "diffattn_request_duration_seconds", "time from a completion request's arrival to its last token");
  return out;
}

void Server::record(const std::vector<std::shared_ptr<infer::Sequence>>& seqs, Clock::time_point arrived) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& s : seqs) {
    const double t = s->ttft();
    if (t >= 0) ttft_.add(t);
  }
  latency_.add(std::chrono::duration<double>(Clock::now() - arrived).count());
}

}  // namespace diffattn::serve
