// The server class behind `diffattn serve` (server.h), private to src/serve: its state and
// members, defined by concern in server.cpp (start-up and the routes: completions, tokenize,
// models, health), streaming.cpp (server-sent events: a choice's text token by token, stop
// strings held back) and metrics.cpp (the /metrics counters and histograms).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>
#include "diffattn/base/files.h"
#include "diffattn/data/data.h"
#include "diffattn/data/hf_tokenizer.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/train/train.h"
#include "diffattn/grammar/token_mask.h"
#include "diffattn/http/http_server.h"
#include "diffattn/serve/server.h"
#include "diffattn/infer/scheduler.h"
#include "serve/openai.h"

namespace diffattn::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

inline std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The longest prefix of s that does not end inside a UTF-8 character (an incomplete lead byte
// sequence at the end waits for more bytes; invalid bytes are let through, JSON replaces them).
inline size_t utf8_safe_end(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

// Prometheus histogram of seconds.
struct Histogram {
  static constexpr double kBounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  uint64_t counts[sizeof kBounds / sizeof kBounds[0] + 1] = {};
  double sum = 0;
  uint64_t n = 0;
  void add(double s) {
    size_t i = 0;
    while (i < sizeof kBounds / sizeof kBounds[0] && s > kBounds[i]) ++i;
    ++counts[i];
    sum += s;
    ++n;
  }
  void write(std::string& out, const std::string& name, const std::string& help) const {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    char buf[64];
    for (size_t i = 0; i < sizeof kBounds / sizeof kBounds[0]; ++i) {
      cum += counts[i];
      std::snprintf(buf, sizeof buf, "%g", kBounds[i]);
      out += name + "_bucket{le=\"" + buf + "\"} " + std::to_string(cum) + "\n";
    }
    cum += counts[sizeof kBounds / sizeof kBounds[0]];
    out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
    std::snprintf(buf, sizeof buf, "%.6f", sum);
    out += name + "_sum " + buf + "\n" + name + "_count " + std::to_string(n) + "\n";
  }
};

// One choice's text as its tokens arrive: decoded through the tokenizer's stream (each token
// once, whole UTF-8 characters), stop strings found, and what can be sent held back so that a
// stop string is never sent half.
struct ChoiceText {
  std::vector<int32_t> ids;
  std::unique_ptr<data::TextStream> stream;  // made on the first token
  std::string raw;                           // the stream's text of ids[0, ends.size())
  bool flushed = false;                      // the stream finished (the choice is over)
  std::string text;    // the text to answer (cut at a stop string)
  size_t sent = 0;     // bytes of text already streamed
  bool stopped = false;  // a stop string ended it
  infer::Finish finish = infer::Finish::kNone;
  // With logprobs: each token's; where each token's text ends in raw (advance keeps it).
  std::vector<infer::TokenLogprob> lps;
  std::vector<size_t> ends;
  size_t lp_sent = 0;  // tokens whose log probabilities were streamed

  // Passes the ids not yet decoded through the stream; once the choice is over, its last bytes.
  void advance(const data::Tokenizer& tok) {
    if (!stream) stream = tok.stream();
    while (ends.size() < ids.size()) {
      raw += stream->push(ids[ends.size()]);
      ends.push_back(raw.size());
    }
    if (finish != infer::Finish::kNone && !flushed) {
      raw += stream->finish();
      if (!ends.empty()) ends.back() = raw.size();
      flushed = true;
    }
  }
  void track(const data::Tokenizer& tok) { advance(tok); }
  // Tokens whose log probabilities go with text[0, end): those whose text ends by `end`; once
  // the choice is over, every token that starts before the answer's end (a stop string may
  // cut one).
  size_t lp_upto(size_t end) const {
    size_t k = 0;
    if (!stopped && finish != infer::Finish::kNone) return std::min(ends.size(), lps.size());
    if (stopped) {
      while (k < ends.size() && k < lps.size() && (k == 0 ? 0 : ends[k - 1]) < text.size()) ++k;
      return k;
    }
    while (k < ends.size() && k < lps.size() && ends[k] <= end) ++k;
    return k;
  }

  void update(const data::Tokenizer& tok, const std::vector<std::string>& stops) {
    if (stopped) return;
    advance(tok);
    std::string now = raw;
    size_t cut = std::string::npos;
    for (const std::string& s : stops) {
      const size_t at = now.find(s);
      if (at != std::string::npos && at < cut) cut = at;
    }
    if (cut != std::string::npos) {
      now.resize(cut);
      stopped = true;
    }
    text = std::move(now);
  }
  // Bytes that may be streamed now.
  size_t sendable(const std::vector<std::string>& stops) const {
    if (finish != infer::Finish::kNone || stopped) return text.size();
    size_t hold = 0;
    for (const std::string& s : stops) hold = std::max(hold, s.size() - 1);
    size_t end = text.size() > hold ? text.size() - hold : 0;
    end = utf8_safe_end(text.substr(0, end));
    return std::max(end, sent);
  }
};

class Server {
 public:
  explicit Server(const ServerOptions& o);

  const std::string& name() const { return name_; }
  bool chat_ok() const { return chat_ != nullptr; }

  void handle(const httplib::Request& req, httplib::Response& res);

  // SIGTERM: stop taking requests, cancel what runs (streams end with an error and [DONE]),
  // wait a little for the answers to go out.
  void stop();

 private:
  int error(httplib::Response& res, int status, const std::string& msg,
            const std::string& type = "invalid_request_error", const std::string& code = "",
            const std::string& param = "");

  void count(const std::string& path, int status);

  // Fields a request carried that this server ignores: each name logged once.
  void log_ignored(const std::vector<std::string>& names);

  std::string check_model(const std::string& model) const;

  int tokenize(const httplib::Request& req, httplib::Response& res);

  int detokenize(const httplib::Request& req, httplib::Response& res);

  // The token masker of constrained output, built at the first request that needs it (a
  // vocabulary's trie: 50 to 170 ms for 128K tokens).
  std::shared_ptr<const grammar::TokenMasker> masker();

  // A token's text for logprobs: its bytes (a special token: its decoded text).
  std::string token_text(int32_t id) const;

  static json bytes_of(const std::string& s);

  // Chat: choices[].logprobs.content[] entries.
  json chat_logprobs(const std::vector<infer::TokenLogprob>& lps, size_t from, size_t to) const;

  // Completions: the legacy {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; `lead`
  // entries first (the echoed prompt's, whose first token has null for both), offsets from
  // `offset0`.
  void legacy_logprobs(json& out, const std::vector<infer::TokenLogprob>& lps, size_t from, size_t to,
                       const std::vector<size_t>& ends, size_t offset0) const;

  // The prompt a completion echoes: as given, or the ids' text.
  std::string echo_text(const ApiRequest& r, const std::vector<int32_t>& ids) const;

  // The echoed prompt's legacy log probabilities: its first token has none (null), the others
  // the model's own (Sequence::prompt_logprobs); offsets add up the tokens' texts.
  json echo_logprobs(const std::vector<int32_t>& ids, const std::vector<infer::TokenLogprob>& plps) const;

  static json empty_legacy();

  std::string metrics();

  // Submits the request's n sequences; on failure cancels those already queued.
  std::vector<std::shared_ptr<infer::Sequence>> submit(const ApiRequest& r, const std::vector<int32_t>& ids,
                                                int64_t max_tokens, Clock::time_point deadline);

  // cached: the prompt tokens the first choice took from the prefix cache.
  json usage(int64_t prompt, int64_t completion, int64_t cached) const;

  static const char* reason(const ChoiceText& c);

  int complete(const httplib::Request& req, httplib::Response& res, bool chat);

  void record(const std::vector<std::shared_ptr<infer::Sequence>>& seqs, Clock::time_point arrived);

  int stream(httplib::Response& res, const ApiRequest& r, std::vector<std::shared_ptr<infer::Sequence>> seqs,
             const std::vector<int32_t>& ids, int64_t P, const std::string& id, int64_t created, Clock::time_point arrived, bool chat);

  template <class State, class Chunk>
  bool provide(State& state, const ApiRequest& req, int64_t P, Clock::time_point arrived, const Chunk& chunk,
               bool chat, httplib::DataSink& sink);

  ServerOptions o_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<data::Tokenizer> tok_;
  std::unique_ptr<ChatTemplate> chat_;
  std::unique_ptr<ApiError> chat_error_;
  std::vector<int32_t> stop_ids_;
  infer::SamplerOptions sampling_;  // the ids that may be drawn (vocab_limit, excluded)
  std::string name_;
  int64_t created_ = 0;
  std::unique_ptr<infer::Scheduler> engine_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> id_counter_{0}, seed_counter_{0};
  std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::set<std::string> logged_;  // ignored request fields already logged
  std::once_flag masker_once_;
  std::shared_ptr<const grammar::TokenMasker> masker_;
  Histogram ttft_, latency_;
};

}  // namespace diffattn::serve
