// `diffattn serve` (server.h): start-up and the routes (completions whole, tokenize,
// detokenize, models, health) over the engine and the shared HTTP server; streamed answers are
// streaming.cpp's, /metrics metrics.cpp's.
#include "serve/server_impl.h"

#include "serve/constraint.h"

namespace diffattn::serve {

Server::Server(const ServerOptions& o) : o_(o) {
  // The directory is resolved once: config.json, tokenizer_config.json and
  // generation_config.json are read here and nowhere else.
  const model::ModelDir dir = model::open_model_dir(o.model_dir);
  model_ = std::make_unique<model::Model>(model::load_model(dir));
  tok_ = data::tokenizer_for(dir, o.tokenizer);
  stop_ids_ = train::stop_ids_for(dir, *tok_, model_->config().vocab_size);
  // Only ids the tokenizer can decode are sampled: a padded embedding's extra rows have no
  // text (decoding one would fail the request).
  train::restrict_to_tokens(sampling_, *tok_, model_->config().vocab_size);
  // The model's chat template, parsed once: one that does not parse stops the start-up; a
  // model without one answers chat requests with a 400.
  try {
    chat_ = std::make_unique<ChatTemplate>(ChatTemplate::from_model_dir(dir));
  } catch (const ApiError& e) {
    chat_error_ = std::make_unique<ApiError>(e);
  }
  name_ = o.model_name;
  if (name_.empty()) {
    std::string d = o.model_dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const size_t slash = d.rfind('/');
    name_ = slash == std::string::npos ? d : d.substr(slash + 1);
  }
  created_ = static_cast<int64_t>(std::time(nullptr));
  engine_ = std::make_unique<infer::Scheduler>(*model_, o.engine);
}

void Server::handle(const httplib::Request& req, httplib::Response& res) {
  const std::string& p = req.path;
  int status = 200;
  const bool open = p == "/health" || p == "/metrics";  // probes and scrapers need no key
  if (!o_.api_key.empty() && !open && !bearer_matches(req.get_header_value("Authorization"), o_.api_key)) {
    res.set_header("WWW-Authenticate", "Bearer");
    status = error(res, 401,
                   req.has_header("Authorization")
                       ? "invalid API key (this server takes \"Authorization: Bearer KEY\" with the key it was started with)"
                       : "missing API key: send \"Authorization: Bearer KEY\"",
                   "invalid_request_error", "invalid_api_key");
  } else if (p == "/health" || p == "/metrics" || p == "/v1/models") {
    if (req.method != "GET" && req.method != "HEAD") {
      status = error(res, 405, "use GET for " + p, "invalid_request_error", "method_not_allowed");
    } else if (p == "/health") {
      res.set_content(stopping_ ? R"({"status":"stopping"})" : R"({"status":"ok"})", "application/json");
      if (stopping_) status = res.status = 503;
    } else if (p == "/metrics") {
      res.set_content(metrics(), "text/plain; version=0.0.4; charset=utf-8");
    } else {
      json m = {{"id", name_}, {"object", "model"}, {"created", created_}, {"owned_by", "diffattn"},
                {"max_model_len", model_->config().max_seq_len}};
      res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    }
  } else if (p == "/v1/completions" || p == "/v1/chat/completions") {
    if (req.method != "POST") {
      status = error(res, 405, "use POST for " + p, "invalid_request_error", "method_not_allowed");
    } else {
      status = complete(req, res, p == "/v1/chat/completions");
    }
  } else if (p == "/tokenize" || p == "/detokenize") {
    if (req.method != "POST") {
      status = error(res, 405, "use POST for " + p, "invalid_request_error", "method_not_allowed");
    } else {
      status = p == "/tokenize" ? tokenize(req, res) : detokenize(req, res);
    }
  } else {
    status = error(res, 404, "no such endpoint: " + req.method + " " + p.substr(0, 100) +
                                 " (this server has /v1/completions, /v1/chat/completions, "
                                 "/v1/models, /tokenize, /detokenize, /health, /metrics)",
                   "invalid_request_error", "not_found");
  }
  count(p, status);
}

// SIGTERM: stop taking requests, cancel what runs (streams end with an error and [DONE]),
// wait a little for the answers to go out.
void Server::stop() {
  stopping_ = true;
  engine_->shutdown();
  const auto until = Clock::now() + std::chrono::seconds(3);
  while (in_flight_ > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

int Server::error(httplib::Response& res, int status, const std::string& msg,
          const std::string& type, const std::string& code,
          const std::string& param) {
  res.status = status;
  res.set_content(error_json(msg, type, param, code), "application/json");
  return status;
}

// Fields a request carried that this server ignores: each name logged once.
void Server::log_ignored(const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& n : names) {
    // At most 1,000 names of at most 64 bytes are remembered (a client chooses them).
    const std::string name = n.size() > 64 ? n.substr(0, 64) + "..." : n;
    if (logged_.size() < 1000 && logged_.insert(name).second) {
      std::fprintf(stderr, "diffattn serve: ignoring the request field %s (not used by this server; said once)\n",
                   dump(json(name)).c_str());
    }
  }
}

std::string Server::check_model(const std::string& model) const {
  if (model.empty() || model == name_) return "";
  return "the model " + dump(json(model)) + " does not exist; this server has \"" + name_ + "\"";
}

int Server::tokenize(const httplib::Request& req, httplib::Response& res) {
  std::vector<int32_t> ids;
  try {
    const TokenizeRequest r = parse_tokenize(req.body, o_.api);
    log_ignored(r.ignored);
    const std::string bad = check_model(r.model);
    if (!bad.empty()) return error(res, 404, bad, "invalid_request_error", "model_not_found", "model");
    if (!r.messages.empty()) {
      if (!chat_) throw *chat_error_;
      const std::string text = chat_->render(r.messages, r.add_generation_prompt, r.tools);
      ids = tok_->encode(text, false);
    } else {
      ids = tok_->encode(r.prompt, r.add_special_tokens);
    }
  } catch (const ApiError& e) {
    return error(res, e.status, e.what(), e.type, e.code, e.param);
  } catch (const Error& e) {
    return error(res, 400, e.what(), "invalid_request_error", "invalid_value", "prompt");
  }
  json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model_->config().max_seq_len}};
  res.set_content(dump(out), "application/json");
  return 200;
}

int Server::detokenize(const httplib::Request& req, httplib::Response& res) {
  std::string text;
  try {
    const DetokenizeRequest r = parse_detokenize(req.body, o_.api);
    log_ignored(r.ignored);
    const std::string bad = check_model(r.model);
    if (!bad.empty()) return error(res, 404, bad, "invalid_request_error", "model_not_found", "model");
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      if (!tok_->is_token(r.tokens[i])) {
        return error(res, 400, "'tokens[" + std::to_string(i) + "]' (" + std::to_string(r.tokens[i]) +
                                   ") is not a token of this model's tokenizer (0.." +
                                   std::to_string(tok_->vocab_size() - 1) + ")",
                     "invalid_request_error", "invalid_value", "tokens[" + std::to_string(i) + "]");
      }
    }
    text = tok_->decode(r.tokens);
  } catch (const ApiError& e) {
    return error(res, e.status, e.what(), e.type, e.code, e.param);
  } catch (const Error& e) {
    return error(res, 400, e.what(), "invalid_request_error", "invalid_value", "tokens");
  }
  res.set_content(dump(json{{"prompt", text}}), "application/json");
  return 200;
}

// The token masker of constrained output, built at the first request that needs it (a
// vocabulary's trie: 50 to 170 ms for 128K tokens).
std::shared_ptr<const grammar::TokenMasker> Server::masker() {
  std::call_once(masker_once_, [this] {
    const int64_t V = model_->config().vocab_size;
    std::vector<std::string> bytes(static_cast<size_t>(V));
    for (int64_t id = 0; id < V; ++id) {
      const auto i = static_cast<int32_t>(id);
      if (id < tok_->vocab_size() && tok_->is_token(i) &&
          !std::binary_search(sampling_.excluded.begin(), sampling_.excluded.end(), i) &&
          (sampling_.vocab_limit == 0 || id < sampling_.vocab_limit)) {
        bytes[static_cast<size_t>(id)] = tok_->token_bytes(i);
      }
    }
    masker_ = std::make_shared<const grammar::TokenMasker>(std::move(bytes), stop_ids_);
  });
  return masker_;
}

// A token's text for logprobs: its bytes (a special token: its decoded text).
std::string Server::token_text(int32_t id) const {
  if (id < 0 || id >= tok_->vocab_size() || !tok_->is_token(id)) return "";
  std::string b = tok_->token_bytes(id);
  if (b.empty()) b = tok_->decode({id});
  return b;
}

json Server::bytes_of(const std::string& s) {
  json a = json::array();
  for (const char c : s) a.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return a;
}

// Chat: choices[].logprobs.content[] entries.
json Server::chat_logprobs(const std::vector<infer::TokenLogprob>& lps, size_t from, size_t to) const {
  json content = json::array();
  for (size_t i = from; i < to; ++i) {
    const infer::TokenLogprob& t = lps[i];
    const std::string s = token_text(t.id);
    json top = json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string ts = token_text(id);
      top.push_back({{"token", ts}, {"logprob", lp}, {"bytes", bytes_of(ts)}});
    }
    content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Completions: the legacy {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; `lead`
// entries first (the echoed prompt's, whose first token has null for both), offsets from
// `offset0`.
void Server::legacy_logprobs(json& out, const std::vector<infer::TokenLogprob>& lps, size_t from, size_t to,
                     const std::vector<size_t>& ends, size_t offset0) const {
  for (size_t i = from; i < to; ++i) {
    const infer::TokenLogprob& t = lps[i];
    out["tokens"].push_back(token_text(t.id));
    out["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, lp] : t.top) {
      const std::string ts = token_text(id);
      if (!top.contains(ts)) top[ts] = lp;
    }
    const std::string self = token_text(t.id);
    if (!top.contains(self)) top[self] = t.logprob;
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(offset0 + (i == 0 ? 0 : ends[i - 1]));
  }
}

// The prompt a completion echoes: as given, or the ids' text.
std::string Server::echo_text(const ApiRequest& r, const std::vector<int32_t>& ids) const {
  return r.prompt_is_ids ? tok_->decode(ids) : r.prompt;
}

// The echoed prompt's legacy log probabilities: its first token has none (null), the others
// the model's own (Sequence::prompt_logprobs); offsets add up the tokens' texts.
json Server::echo_logprobs(const std::vector<int32_t>& ids, const std::vector<infer::TokenLogprob>& plps) const {
  json out = empty_legacy();
  size_t offset = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string t = token_text(ids[k]);
    out["tokens"].push_back(t);
    out["text_offset"].push_back(offset);
    offset += t.size();
    if (k == 0 || k - 1 >= plps.size()) {
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      continue;
    }
    const infer::TokenLogprob& p = plps[k - 1];
    out["token_logprobs"].push_back(p.logprob);
    json top = json::object();
    for (const auto& [id, lp] : p.top) {
      const std::string ts = token_text(id);
      if (!top.contains(ts)) top[ts] = lp;
    }
    if (!top.contains(t)) top[t] = p.logprob;
    out["top_logprobs"].push_back(top);
  }
  return out;
}

json Server::empty_legacy() {
  return {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

// Submits the request's n sequences; on failure cancels those already queued.
std::vector<std::shared_ptr<infer::Sequence>> Server::submit(const ApiRequest& r, const std::vector<int32_t>& ids,
                                              int64_t max_tokens, Clock::time_point deadline) {
  std::vector<std::shared_ptr<infer::Sequence>> seqs;
  const uint64_t base = r.seed ? static_cast<uint64_t>(*r.seed)
                               : static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                                     (0x9E3779B97F4A7C15ull * ++seed_counter_);
  try {
    for (int64_t i = 0; i < r.n; ++i) {
      infer::SeqRequest s;
      s.prompt = ids;
      s.max_tokens = max_tokens;
      s.sampler.temperature = r.temperature;
      s.sampler.top_p = r.top_p;
      s.sampler.top_k = r.top_k;
      s.sampler.seed = base + static_cast<uint64_t>(i);
      s.sampler.vocab_limit = sampling_.vocab_limit;
      s.sampler.excluded = sampling_.excluded;
      s.sampler.presence_penalty = r.presence_penalty;
      s.sampler.frequency_penalty = r.frequency_penalty;
      s.sampler.logit_bias = r.logit_bias;
      s.stop_ids = stop_ids_;
      s.deadline = deadline;
      if (r.logprobs) s.logprobs = r.top_logprobs;
      s.prompt_logprobs = r.echo && r.logprobs;
      if (r.grammar) s.constraint = grammar_constraint(*r.grammar, masker());
      seqs.push_back(engine_->submit(std::move(s)));
    }
  } catch (...) {
    for (auto& s : seqs) s->cancel();
    throw;
  }
  return seqs;
}

// cached: the prompt tokens the first choice took from the prefix cache.
json Server::usage(int64_t prompt, int64_t completion, int64_t cached) const {
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

const char* Server::reason(const ChoiceText& c) {
  return c.stopped || c.finish == infer::Finish::kStop ? "stop" : "length";
}

int Server::complete(const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto arrived = Clock::now();
  if (stopping_) return error(res, 503, "the server is shutting down", "server_error", "shutting_down");
  ApiRequest r;
  std::vector<int32_t> ids;
  try {
    r = parse_request(req.body, chat, o_.api);
    log_ignored(r.ignored);
    const std::string bad = check_model(r.model);
    if (!bad.empty()) return error(res, 404, bad, "invalid_request_error", "model_not_found", "model");
    const int64_t V = model_->config().vocab_size;
    for (const auto& [id, b] : r.logit_bias) {
      if (id >= V) {
        return error(res, 400, "'logit_bias' names token " + std::to_string(id) + ", outside the model's " +
                                   std::to_string(V) + " ids",
                     "invalid_request_error", "invalid_value", "logit_bias");
      }
    }
    if (chat) {
      if (!chat_) throw *chat_error_;
      const std::string text = chat_->render(r.messages, true, r.tools);
      ids = tok_->encode(text, false);
    } else if (r.prompt_is_ids) {
      ids = r.prompt_ids;
    } else {
      // As `diffattn generate` does: an empty prompt starts from a newline.
      ids = tok_->encode(r.prompt.empty() ? std::string("\n") : r.prompt);
      if (ids.empty()) throw ApiError("'prompt' encodes to no tokens", "prompt");
    }
  } catch (const ApiError& e) {
    return error(res, e.status, e.what(), e.type, e.code, e.param);
  } catch (const Error& e) {
    return error(res, 400, e.what(), "invalid_request_error", "invalid_value", chat ? "messages" : "prompt");
  }
  const int64_t P = static_cast<int64_t>(ids.size()), ctx = model_->config().max_seq_len;
  if (P >= ctx) {
    return error(res, 400, "the prompt has " + std::to_string(P) + " tokens; the model's context is " +
                               std::to_string(ctx) + " (the prompt and at least one new token must fit)",
                 "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt");
  }
  const int64_t max_tokens = r.max_tokens ? *r.max_tokens
                                          : chat ? std::min(o_.api.max_tokens, ctx - P) : int64_t{16};
  if (P + max_tokens > ctx) {
    return error(res, 400, "the prompt (" + std::to_string(P) + " tokens) plus max_tokens (" +
                               std::to_string(max_tokens) + ") exceed the model's context of " +
                               std::to_string(ctx) + " tokens",
                 "invalid_request_error", "context_length_exceeded", "max_tokens");
  }
  std::vector<std::shared_ptr<infer::Sequence>> seqs;
  try {
    seqs = submit(r, ids, max_tokens, arrived + std::chrono::seconds(o_.timeout_seconds));
  } catch (const infer::QueueFull& e) {
    res.set_header("Retry-After", "1");
    return error(res, 503, e.what(), "server_error", "queue_full");
  } catch (const InvalidArgument& e) {
    return error(res, 400, e.what(), "invalid_request_error", "invalid_value");
  } catch (const Error& e) {
    return error(res, 503, e.what(), "server_error", "shutting_down");
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(++id_counter_);
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  if (r.stream) return stream(res, r, std::move(seqs), ids, P, id, created, arrived, chat);

  // A whole answer: wait for every choice, giving up when the client goes away.
  ++in_flight_;
  std::vector<ChoiceText> choices(seqs.size());
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < seqs.size(); ++i) {
      ChoiceText& c = choices[i];
      if (c.finish != infer::Finish::kNone) continue;
      std::vector<int32_t> got;
      c.finish = seqs[i]->wait(c.ids.size(), got, c.lps, std::chrono::milliseconds(50));
      if (!got.empty() || c.finish != infer::Finish::kNone) {
        c.ids.insert(c.ids.end(), got.begin(), got.end());
        if (!r.stop.empty()) {
          c.update(*tok_, r.stop);
          if (c.stopped) {
            seqs[i]->cancel();
            c.finish = infer::Finish::kStop;
          }
        }
      }
      all = all && c.finish != infer::Finish::kNone;
    }
    if (all) break;
    if (http::client_gone()) {
      for (auto& s : seqs) s->cancel();
      --in_flight_;
      return 499;  // nobody reads the answer
    }
  }
  --in_flight_;
  record(seqs, arrived);
  json out = json::array();
  int64_t completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    ChoiceText& c = choices[i];
    if (c.finish == infer::Finish::kTimeout) {
      return error(res, 504, "the request ran past its timeout of " + std::to_string(o_.timeout_seconds) + " s",
                   "timeout_error", "timeout");
    }
    if (c.finish == infer::Finish::kCancelled) return error(res, 503, "the server is shutting down", "server_error", "shutting_down");
    if (c.finish == infer::Finish::kError) return error(res, 500, "generation failed: " + seqs[i]->error(), "server_error");
    if (!c.stopped) c.update(*tok_, r.stop);
    completion += static_cast<int64_t>(c.ids.size());
    json ch = {{"index", i}, {"finish_reason", reason(c)}};
    if (r.logprobs) c.track(*tok_);
    if (chat) {
      ch["message"] = {{"role", "assistant"}, {"content", c.text}};
      ch["logprobs"] = r.logprobs ? chat_logprobs(c.lps, 0, c.lp_upto(c.text.size())) : json(nullptr);
    } else {
      const std::string echoed = r.echo ? echo_text(r, ids) : std::string();
      ch["text"] = echoed + c.text;
      if (r.logprobs) {
        json lp = r.echo ? echo_logprobs(ids, seqs[i]->prompt_logprobs()) : empty_legacy();
        legacy_logprobs(lp, c.lps, 0, c.lp_upto(c.text.size()), c.ends, echoed.size());
        ch["logprobs"] = lp;
      } else {
        ch["logprobs"] = nullptr;
      }
    }
    out.push_back(ch);
  }
  json body = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
               {"model", name_}, {"choices", out}, {"usage", usage(P, completion, seqs[0]->cached_tokens())}};
  res.set_content(dump(body), "application/json");
  return 200;
}


void run_server(const ServerOptions& o, const std::function<void(const std::string&, int)>& ready) {
  Server server(o);
  http::Options h;
  h.host = o.host;
  h.port = o.port;
  h.allow_remote = o.allow_remote;
  h.what = "the server";
  h.remote_hint = " unless --allow-remote is given";
  h.limits.workers = o.workers;
  h.limits.queue = o.queue;
  h.limits.idle_seconds = 30;
  h.limits.request_seconds = 30;
  h.limits.response_seconds = o.timeout_seconds + 30;
  h.limits.keep_alive_requests = 1000;
  h.limits.max_body_bytes = o.max_body_bytes;
  h.limits.max_discard_bytes = o.max_body_bytes + (1 << 20);
  h.error_body = [](int status, const std::string& message) {
    return error_json(message, status >= 500 ? "server_error" : "invalid_request_error");
  };
  h.handler = [&server](const httplib::Request& req, httplib::Response& res) {
    try {
      server.handle(req, res);
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(error_json(std::string("internal error: ") + e.what(), "server_error"), "application/json");
    }
  };
  h.ready = ready;
  h.on_stop = [&server] { server.stop(); };
  http::serve(h);
  server.stop();
}

}  // namespace diffattn::serve
