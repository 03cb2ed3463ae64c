// Streamed answers of `diffattn serve` (server_impl.h): server-sent events, each choice's text
// decoded token by token (ChoiceText), stop strings held back, usage and [DONE] at the end.
#include "serve/server_impl.h"

namespace diffattn::serve {

int Server::stream(httplib::Response& res, const ApiRequest& r, std::vector<std::shared_ptr<infer::Sequence>> seqs,
           const std::vector<int32_t>& ids, int64_t P, const std::string& id, int64_t created, Clock::time_point arrived, bool chat) {
  struct State {
    std::vector<std::shared_ptr<infer::Sequence>> seqs;
    std::vector<ChoiceText> choices;
    std::vector<bool> started, closed;
    bool done = false;
    std::vector<int32_t> ids;  // the prompt (echo)
    std::string echoed;        // the echoed prompt's text ("" without echo)
  };
  auto st = std::make_shared<State>();
  st->seqs = std::move(seqs);
  st->ids = ids;
  if (!chat && r.echo) st->echoed = echo_text(r, ids);
  st->choices.resize(st->seqs.size());
  st->started.assign(st->seqs.size(), false);
  st->closed.assign(st->seqs.size(), false);
  ++in_flight_;
  res.set_header("X-Accel-Buffering", "no");
  const ApiRequest req = r;
  auto chunk = [this, id, created, chat](const json& choices, const json* u) {
    json j = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created}, {"model", name_}, {"choices", choices}};
    if (u != nullptr) j["usage"] = *u;
    return "data: " + dump(j) + "\n\n";
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, req, P, arrived, chunk, chat](size_t offset, httplib::DataSink& sink) {
        // Nothing may escape into httplib (it would close the connection without a word).
        try {
          return provide(*st, req, P, arrived, chunk, chat, sink);
        } catch (const std::exception& e) {
          for (auto& s : st->seqs) s->cancel();
          const std::string out = "data: " + error_json(std::string("internal error: ") + e.what(), "server_error") +
                                  "\n\ndata: [DONE]\n\n";
          st->done = true;
          if (sink.write(out.data(), out.size())) sink.done();
          return true;
        }
        (void)offset;
      },
      [this, st](bool) {
        for (auto& s : st->seqs) s->cancel();  // whatever way the stream ended
        --in_flight_;
      });
  return 200;
}

template <class State, class Chunk>
bool Server::provide(State& state, const ApiRequest& req, int64_t P, Clock::time_point arrived, const Chunk& chunk,
             bool chat, httplib::DataSink& sink) {
  State* st = &state;
  if (st->done) return false;
  std::string out;
  bool all = true, waited = false;
  std::string failure;
  for (size_t i = 0; i < st->seqs.size(); ++i) {
    ChoiceText& c = st->choices[i];
    if (st->closed[i]) continue;
    std::vector<int32_t> got;
    if (c.finish == infer::Finish::kNone) {
      // The first choice still running waits for news (up to 100 ms); the others are
      // only looked at, so a call neither spins nor sleeps once per choice.
      c.finish = st->seqs[i]->wait(c.ids.size(), got, c.lps, std::chrono::milliseconds(waited ? 0 : 100));
      waited = true;
      c.ids.insert(c.ids.end(), got.begin(), got.end());
      if (!got.empty() || c.finish != infer::Finish::kNone) c.update(*tok_, req.stop);
      if (c.stopped && c.finish == infer::Finish::kNone) {
        st->seqs[i]->cancel();
        c.finish = infer::Finish::kStop;
      }
      if (req.logprobs) c.track(*tok_);
    }
    if (c.finish == infer::Finish::kTimeout) failure = "the request ran past its timeout of " + std::to_string(o_.timeout_seconds) + " s";
    if (c.finish == infer::Finish::kCancelled && !c.stopped) failure = "the server is shutting down";
    if (c.finish == infer::Finish::kError) failure = "generation failed: " + st->seqs[i]->error();
    // Completions with echo: the prompt first (with its log probabilities, complete once a
    // token exists).
    if (!chat && req.echo && !st->started[i] && (!c.ids.empty() || c.finish != infer::Finish::kNone)) {
      st->started[i] = true;
      const json lp = req.logprobs ? echo_logprobs(st->ids, st->seqs[i]->prompt_logprobs()) : json(nullptr);
      out += chunk(json::array({{{"index", i}, {"text", st->echoed}, {"logprobs", lp}, {"finish_reason", nullptr}}}), nullptr);
    }
    const size_t end = c.sendable(req.stop);
    json delta = json::object();
    bool any = false;
    if (chat && !st->started[i]) {
      delta["role"] = "assistant";
      delta["content"] = "";
      st->started[i] = any = true;
    }
    // The log probabilities of the tokens whose text goes out now (all that are left when
    // the choice ends).
    const auto lps_upto = [&](size_t text_end) {
      const size_t k = std::max(c.lp_sent, c.lp_upto(text_end));
      json lp = nullptr;
      if (req.logprobs) {
        if (chat) {
          lp = chat_logprobs(c.lps, c.lp_sent, k);
        } else {
          lp = empty_legacy();
          legacy_logprobs(lp, c.lps, c.lp_sent, k, c.ends, st->echoed.size());
        }
      }
      c.lp_sent = k;
      return lp;
    };
    if (end > c.sent) {
      const std::string piece = c.text.substr(c.sent, end - c.sent);
      c.sent = end;
      if (chat) delta["content"] = delta.value("content", "") + piece;
      any = true;
      if (!chat) {
        out += chunk(json::array({{{"index", i}, {"text", piece}, {"logprobs", lps_upto(end)}, {"finish_reason", nullptr}}}), nullptr);
        any = false;
      }
    }
    if (any) out += chunk(json::array({{{"index", i}, {"delta", delta}, {"logprobs", lps_upto(end)}, {"finish_reason", nullptr}}}), nullptr);
    if (c.finish != infer::Finish::kNone && failure.empty()) {
      st->closed[i] = true;
      const json lp = lps_upto(c.text.size());
      const json fin = chat ? json{{"index", i}, {"delta", json::object()}, {"logprobs", lp}, {"finish_reason", reason(c)}}
                            : json{{"index", i}, {"text", ""}, {"logprobs", lp}, {"finish_reason", reason(c)}};
      out += chunk(json::array({fin}), nullptr);
    }
    all = all && c.finish != infer::Finish::kNone;
  }
  if (!failure.empty()) {
    for (auto& s : st->seqs) s->cancel();
    out += "data: " + error_json(failure, "server_error") + "\n\ndata: [DONE]\n\n";
    st->done = true;
  } else if (all) {
    record(st->seqs, arrived);
    if (req.include_usage) {
      int64_t completion = 0;
      for (const ChoiceText& c : st->choices) completion += static_cast<int64_t>(c.ids.size());
      const json u = usage(P, completion, st->seqs[0]->cached_tokens());
      out += chunk(json::array(), &u);
    }
    out += "data: [DONE]\n\n";
    st->done = true;
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    for (auto& s : st->seqs) s->cancel();
    return false;
  }
  if (st->done) {
    sink.done();
    return true;
  }
  if (out.empty() && http::client_gone()) {
    for (auto& s : st->seqs) s->cancel();
    return false;
  }
  return true;
}

}  // namespace diffattn::serve
