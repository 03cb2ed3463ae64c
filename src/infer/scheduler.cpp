// The scheduler (include/diffattn/infer/scheduler.h): sequences and the continuous-batching
// loop over a session.
#include "diffattn/infer/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace diffattn::infer {

using Clock = std::chrono::steady_clock;

// ---- Sequence ----

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kNone: return "none";
    case Finish::kStop: return "stop";
    case Finish::kLength: return "length";
    case Finish::kCancelled: return "cancelled";
    case Finish::kTimeout: return "timeout";
    case Finish::kError: return "error";
  }
  return "?";
}

Finish Sequence::wait(size_t have, std::vector<int32_t>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return tokens_.size() > have || finish_ != Finish::kNone; });
  if (tokens_.size() > have) out.insert(out.end(), tokens_.begin() + static_cast<long>(have), tokens_.end());
  return finish_;
}

Finish Sequence::wait(size_t have, std::vector<int32_t>& out, std::vector<TokenLogprob>& lp,
                      std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return tokens_.size() > have || finish_ != Finish::kNone; });
  if (tokens_.size() > have) out.insert(out.end(), tokens_.begin() + static_cast<long>(have), tokens_.end());
  if (logprobs_.size() > have) lp.insert(lp.end(), logprobs_.begin() + static_cast<long>(have), logprobs_.end());
  return finish_;
}

int64_t Sequence::cached_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_tokens_;
}

std::vector<TokenLogprob> Sequence::prompt_logprobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prompt_logprobs_;
}

TokenLogprob logprob_of(const float* z, int64_t V, double T, int32_t id, int64_t top) {
  if (!(T > 0)) T = 1;
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(z[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp((z[i] - mx) / T);
  const double lse = mx / T + std::log(sum);
  const auto lp = [&](int32_t i) {
    const double v = z[i] / T - lse;
    return static_cast<float>(std::isfinite(v) ? std::max(v, -9999.0) : -9999.0);
  };
  TokenLogprob out;
  out.id = id;
  out.logprob = lp(id);
  // The top ones by one pass, kept in order (top is small).
  std::vector<int32_t> best;
  for (int64_t i = 0; i < V && top > 0; ++i) {
    const auto ii = static_cast<int32_t>(i);
    if (static_cast<int64_t>(best.size()) == top && !(z[i] > z[best.back()])) continue;
    auto at = std::upper_bound(best.begin(), best.end(), ii,
                               [z](int32_t a, int32_t b) { return z[a] > z[b]; });
    best.insert(at, ii);
    if (static_cast<int64_t>(best.size()) > top) best.pop_back();
  }
  for (const int32_t b : best) out.top.emplace_back(b, lp(b));
  return out;
}

void Sequence::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_ = true;
}

std::string Sequence::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

double Sequence::ttft() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (tokens_.empty()) return -1;
  return std::chrono::duration<double>(first_token_ - submitted_).count();
}

// ---- Scheduler ----

Scheduler::Scheduler(const model::Model& model, const SchedulerOptions& o)
    : m_(model), o_(o), kv_(model, o.n_blocks, o.block_size, o.kv_dtype), alloc_(kv_.blocks()),
      session_(model, kv_) {
  if (o.max_batch < 1 || o.max_waiting < 0 || o.prefill_chunk < 1) {
    throw InvalidArgument("scheduler: max_batch and prefill_chunk must be >= 1, max_waiting >= 0");
  }
  // A recurrent model's state after a prefix is not in its blocks: no prefix cache.
  if (model.config().recurrent()) o_.prefix_cache = false;
  stats_.total_blocks = stats_.free_blocks = alloc_.total();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(); }

void Scheduler::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::shared_ptr<Sequence> Scheduler::submit(SeqRequest r) {
  const int64_t P = static_cast<int64_t>(r.prompt.size());
  const int64_t cap = m_.config().max_seq_len, V = m_.config().vocab_size;
  if (P < 1) throw InvalidArgument("the prompt has no tokens");
  for (const int32_t t : r.prompt) {
    if (t < 0 || t >= V) {
      throw InvalidArgument("prompt token " + std::to_string(t) + " is outside the vocabulary (0.." +
                            std::to_string(V - 1) + ")");
    }
  }
  if (r.max_tokens < 0) throw InvalidArgument("max_tokens must be >= 0");
  if (P + r.max_tokens > cap) {
    throw InvalidArgument("the prompt (" + std::to_string(P) + " tokens) plus max_tokens (" +
                          std::to_string(r.max_tokens) + ") exceed the model's context of " +
                          std::to_string(cap) + " tokens");
  }
  if (alloc_.blocks_for(P + r.max_tokens) > alloc_.total()) {
    throw InvalidArgument("the prompt plus max_tokens need more KV blocks than the whole pool (" +
                          std::to_string(alloc_.total()) + " of " +
                          std::to_string(alloc_.block_size()) + " positions)");
  }
  Sampler check(r.sampler);  // throws on bad sampler options, before anything is queued
  (void)check;
  if (r.constraint && r.constraint->vocab_size() != V) {
    throw InvalidArgument("constrained output needs a token mask over the model's " + std::to_string(V) +
                          " ids, got one over " + std::to_string(r.constraint->vocab_size()));
  }
  auto seq = std::make_shared<Sequence>();
  seq->prompt_len_ = P;
  seq->submitted_ = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw Error("the server is shutting down");
    if (static_cast<int64_t>(waiting_.size()) >= o_.max_waiting) {
      throw QueueFull("the server is at capacity: " + std::to_string(stats_.running) +
                      " sequences running and " + std::to_string(waiting_.size()) +
                      " waiting (the most it queues); try again in a moment");
    }
    waiting_.emplace_back(seq, std::move(r));
    stats_.waiting = static_cast<int64_t>(waiting_.size());
  }
  cv_.notify_all();
  return seq;
}

void Scheduler::finish(Running& r, Finish f, const std::string& error) {
  kv_.close(r.id);
  r.ended = true;
  ended_.push_back({r.seq, f, error});
}

void Scheduler::publish_ended() {
  for (Ended& e : ended_) {
    {
      std::lock_guard<std::mutex> lock(e.seq->mu_);
      if (e.seq->finish_ == Finish::kNone) {
        e.seq->finish_ = e.how;
        e.seq->error_ = std::move(e.error);
      }
    }
    e.seq->cv_.notify_all();
  }
  ended_.clear();
}

bool Scheduler::take(Running& r, const float* logits) {
  const int64_t V = m_.config().vocab_size;
  const uint8_t* allowed = nullptr;
  if (r.constraint) {
    // Constrained output: only the tokens the constraint allows; none left means the document
    // is complete (and the vocabulary has no end-of-sequence id to say so) or stuck.
    r.constraint->allowed(r.mask);
    const int64_t n = std::min<int64_t>(V, static_cast<int64_t>(r.mask.size()));
    r.mask.resize(static_cast<size_t>(V), 0);
    if (std::find(r.mask.begin(), r.mask.begin() + n, uint8_t{1}) == r.mask.begin() + n) {
      if (r.constraint->complete()) {
        finish(r, Finish::kStop);
      } else {
        finish(r, Finish::kError, "constrained output: no token of the vocabulary continues the document");
      }
      return false;
    }
    allowed = r.mask.data();
  }
  const int32_t next = r.sampler->sample(logits, V, allowed);
  if (std::find(r.req.stop_ids.begin(), r.req.stop_ids.end(), next) != r.req.stop_ids.end()) {
    finish(r, Finish::kStop);
    return false;
  }
  TokenLogprob lp;
  if (r.req.logprobs >= 0) {
    lp = logprob_of(r.sampler->last_logits(), r.sampler->last_vocab(), r.req.sampler.temperature, next,
                    r.req.logprobs);
  }
  if (r.constraint && !r.constraint->advance(next)) {
    finish(r, Finish::kError, "constrained output: the sampler drew a token the constraint refuses");
    return false;
  }
  ++r.generated;
  r.last = next;
  {
    std::lock_guard<std::mutex> lock(r.seq->mu_);
    if (r.seq->tokens_.empty()) r.seq->first_token_ = Clock::now();
    r.seq->tokens_.push_back(next);
    if (r.req.logprobs >= 0) r.seq->logprobs_.push_back(std::move(lp));
  }
  r.seq->cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.generated_tokens;
  }
  if (r.constraint && r.constraint->closed()) {
    finish(r, Finish::kStop);  // a whole document, and nothing may follow it
    return false;
  }
  if (r.generated >= r.req.max_tokens) {
    finish(r, Finish::kLength);
    return false;
  }
  return true;
}

void Scheduler::step(std::vector<std::unique_ptr<Running>>& running, std::vector<float>& logits) {
  const auto now = Clock::now();
  // 1. Leave: cancelled or out of time.
  for (auto& r : running) {
    bool cancel = false;
    {
      std::lock_guard<std::mutex> lock(r->seq->mu_);
      cancel = r->seq->cancel_;
    }
    if (cancel) {
      finish(*r, Finish::kCancelled);
    } else if (now >= r->req.deadline) {
      finish(*r, Finish::kTimeout);
    }
  }
  running.erase(std::remove_if(running.begin(), running.end(),
                               [](const auto& r) { return r->ended; }),
                running.end());
  // 2. Join: first come first served while the batch and the pool have room.
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!waiting_.empty() && static_cast<int64_t>(running.size()) < o_.max_batch) {
      auto& [seq, req] = waiting_.front();
      bool drop = false;
      {
        std::lock_guard<std::mutex> sl(seq->mu_);
        drop = seq->cancel_;
      }
      if (drop || now >= req.deadline) {
        {
          std::lock_guard<std::mutex> sl(seq->mu_);
          seq->finish_ = drop ? Finish::kCancelled : Finish::kTimeout;
        }
        seq->cv_.notify_all();
        waiting_.pop_front();
        continue;
      }
      const int64_t P = static_cast<int64_t>(req.prompt.size()), span = P + req.max_tokens;
      auto r = std::make_unique<Running>();
      r->id = kv_.open();
      KvStore::Seq& kv = kv_.seq(r->id);
      // The prefix cache: whole blocks of the prompt, but its last token (whose logits the
      // first draw needs), while earlier prompts had them. A request for the prompt's log
      // probabilities computes every position.
      int32_t partial = -1;  // a cached block whose first partial_n rows this prompt shares
      int64_t partial_n = 0;
      if (o_.prefix_cache && !(req.prompt_logprobs && req.logprobs >= 0)) {
        const int64_t bs = alloc_.block_size();
        for (int64_t b = 0; b < (P - 1) / bs; ++b) {
          const int32_t* t = req.prompt.data() + b * bs;
          const uint64_t key = alloc_.key_of(r->key, t);
          const int32_t id = alloc_.lookup(key, t);
          if (id < 0) break;
          kv.table.push_back(id);
          r->key = key;
        }
        r->registered = static_cast<int64_t>(kv.table.size());
        // Then the start of the next block, from a cached block after the same prefix that
        // begins with the same tokens (its rows copied: a prompt rarely ends on a block's edge).
        const int64_t rest = P - 1 - r->registered * bs;
        if (rest > 0) {
          partial = alloc_.lookup_partial(r->key, req.prompt.data() + r->registered * bs,
                                          std::min(rest, bs - 1), partial_n);
        }
      }
      const int64_t have = static_cast<int64_t>(kv.table.size());
      const bool got = alloc_.allocate(alloc_.blocks_for(span) - have, kv.table);
      if (partial >= 0) {  // its rows into the sequence's own next block, then given back
        if (got) kv_.copy_rows(partial, kv.table[static_cast<size_t>(have)], partial_n);
        std::vector<int32_t> lent{partial};
        alloc_.release(lent);
      }
      if (!got) {
        kv_.close(r->id);  // its cached blocks back to the cache
        break;  // wait for blocks
      }
      r->prefilled = kv.len = have * alloc_.block_size() + partial_n;
      stats_.cached_prompt_tokens += r->prefilled;
      {
        std::lock_guard<std::mutex> sl(seq->mu_);
        seq->cached_tokens_ = r->prefilled;
      }
      r->seq = seq;
      r->req = std::move(req);
      r->sampler = std::make_unique<Sampler>(r->req.sampler);
      if (r->req.constraint) r->constraint = r->req.constraint->start();
      running.push_back(std::move(r));
      waiting_.pop_front();
    }
    stats_.waiting = static_cast<int64_t>(waiting_.size());
  }
  // 3. Advance each running sequence by a decode step or a prompt chunk: the decode steps of
  // all sequences past their prompt together (one Session::decode of one row each: the
  // products over the batch, one paged attention call per layer), the prompt chunks one
  // sequence at a time.
  int64_t budget = o_.prefill_chunk, advanced = 0, prompt_done = 0;
  const int64_t V = m_.config().vocab_size;
  std::vector<Running*> decoding;
  for (auto& r : running) {
    if (r->prefilled == static_cast<int64_t>(r->req.prompt.size()) && !r->ended) {
      decoding.push_back(r.get());
    }
  }
  if (!decoding.empty()) {
    const int64_t n = static_cast<int64_t>(decoding.size());
    batch_.clear();
    for (const Running* r : decoding) batch_.add(r->last, kv_.seq(r->id).len, r->id, true);
    batch_logits_.resize(static_cast<size_t>(n * V));
    try {
      session_.decode(batch_, batch_logits_.data());
      for (int64_t i = 0; i < n; ++i) {
        take(*decoding[static_cast<size_t>(i)], &batch_logits_[static_cast<size_t>(i * V)]);
      }
    } catch (const std::exception& e) {
      for (Running* r : decoding) {
        if (!r->ended) finish(*r, Finish::kError, e.what());
      }
    }
    advanced += n;
  }
  for (auto& r : running) {
    const int64_t P = static_cast<int64_t>(r->req.prompt.size());
    try {
      if (r->prefilled < P && !r->ended) {
        if (budget <= 0) continue;
        const int64_t n = std::min(budget, P - r->prefilled);
        // A request for the prompt's log probabilities asks for every row's logits: each
        // position's give the next prompt token's.
        const bool every = r->req.prompt_logprobs && r->req.logprobs >= 0;
        batch_.clear();
        batch_.add_chunk(r->req.prompt.data() + r->prefilled, n, kv_.seq(r->id).len, r->id, every);
        logits.resize(static_cast<size_t>((every ? n : 1) * V));
        session_.decode(batch_, logits.data());
        if (every) {
          for (int64_t i = 0; i < n && r->prefilled + i + 1 < P; ++i) {
            TokenLogprob lp = logprob_of(&logits[static_cast<size_t>(i * V)], V, 1.0,
                                         r->req.prompt[static_cast<size_t>(r->prefilled + i + 1)],
                                         r->req.logprobs);
            std::lock_guard<std::mutex> lock(r->seq->mu_);
            r->seq->prompt_logprobs_.push_back(std::move(lp));
          }
        }
        r->prefilled += n;
        // The prompt's blocks now whole go into the prefix cache.
        if (o_.prefix_cache) {
          const int64_t bs = alloc_.block_size();
          const std::vector<int32_t>& table = kv_.seq(r->id).table;
          while ((r->registered + 1) * bs <= r->prefilled) {
            const int32_t* t = r->req.prompt.data() + r->registered * bs;
            alloc_.register_block(table[static_cast<size_t>(r->registered)], r->key, t);
            r->key = alloc_.key_of(r->key, t);
            ++r->registered;
          }
        }
        budget -= n;
        prompt_done += n;
        ++advanced;
        if (r->prefilled == P) {
          if (r->req.max_tokens == 0) {
            finish(*r, Finish::kLength);  // the prompt alone (its log probabilities, say)
          } else {
            take(*r, &logits[static_cast<size_t>((every ? n - 1 : 0) * V)]);
          }
        }
      }
    } catch (const std::exception& e) {
      finish(*r, Finish::kError, e.what());
    }
  }
  running.erase(std::remove_if(running.begin(), running.end(),
                               [](const auto& r) { return r->ended; }),
                running.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.prompt_tokens += prompt_done;
    stats_.running = static_cast<int64_t>(running.size());
    stats_.free_blocks = alloc_.free_blocks();
    stats_.cached_blocks = alloc_.cached_blocks();
    stats_.last_batch = static_cast<double>(advanced);
  }
  publish_ended();
}

void Scheduler::loop() {
  std::vector<std::unique_ptr<Running>> running;
  std::vector<float> logits(static_cast<size_t>(m_.config().vocab_size));
  int64_t n_steps = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || !running.empty(); });
      if (stop_) break;
    }
    if (o_.before_step) o_.before_step(n_steps++);
    step(running, logits);
  }
  // Shutdown: everything queued or running is cancelled.
  for (auto& r : running) finish(*r, Finish::kCancelled);
  publish_ended();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [seq, req] : waiting_) {
    {
      std::lock_guard<std::mutex> sl(seq->mu_);
      seq->finish_ = Finish::kCancelled;
    }
    seq->cv_.notify_all();
  }
  waiting_.clear();
  stats_.running = stats_.waiting = 0;
  stats_.free_blocks = alloc_.free_blocks();
}

}  // namespace diffattn::infer
