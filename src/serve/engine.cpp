// The serving engine (engine.h): block allocator, sequences and the continuous-batching loop.
#include "serve/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace diffattn::serve {

using Clock = std::chrono::steady_clock;

// ---- BlockAllocator ----

BlockAllocator::BlockAllocator(int64_t n_blocks, int64_t block_size) : block_size_(block_size) {
  check_sizes(n_blocks, block_size);
  ref_.assign(static_cast<size_t>(n_blocks), 0);
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t i = n_blocks - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

void BlockAllocator::check_sizes(int64_t n_blocks, int64_t block_size) {
  if (n_blocks < 1 || n_blocks > (int64_t{1} << 30)) {
    throw InvalidArgument("KV pool: the number of blocks must be in 1..2^30, got " +
                          std::to_string(n_blocks));
  }
  if (block_size < 1 || block_size > 4096) {
    throw InvalidArgument("KV pool: the block size must be in 1..4096 positions, got " +
                          std::to_string(block_size));
  }
}

int64_t BlockAllocator::blocks_for(int64_t positions) const {
  return positions <= 0 ? 0 : (positions + block_size_ - 1) / block_size_;
}

void BlockAllocator::forget(int32_t b) {
  const auto it = cached_.find(b);
  if (it == cached_.end()) return;
  by_key_.erase(it->second.key);
  cached_.erase(it);
}

bool BlockAllocator::allocate(int64_t n, std::vector<int32_t>& table) {
  if (n < 0) throw InvalidArgument("KV pool: cannot allocate " + std::to_string(n) + " blocks");
  if (n > free_blocks()) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = lru_.front();  // the least recently used cached block: its K/V is overwritten
      lru_.pop_front();
      forget(b);
    }
    ref_[static_cast<size_t>(b)] = 1;
    table.push_back(b);
  }
  return true;
}

void BlockAllocator::release(std::vector<int32_t>& table) {
  std::vector<int32_t> sorted = table;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t b = sorted[i];
    if (b < 0 || b >= total() || ref_[static_cast<size_t>(b)] == 0 ||
        (i > 0 && sorted[i - 1] == b)) {
      throw InvalidArgument("KV pool: block " + std::to_string(b) +
                            " is not allocated (or is in the table twice)");
    }
  }
  for (const int32_t b : table) {
    if (--ref_[static_cast<size_t>(b)] > 0) continue;
    const auto it = cached_.find(b);
    if (it != cached_.end()) {
      it->second.lru = lru_.insert(lru_.end(), b);  // kept, most recently used last
    } else {
      free_.push_back(b);
    }
  }
  table.clear();
}

uint64_t BlockAllocator::key_of(uint64_t parent, const int32_t* tokens) const {
  // FNV-1a over the parent's key and the tokens, then a final mix (splitmix64's).
  uint64_t h = 0xcbf29ce484222325ull;
  const auto eat = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  eat(parent);
  for (int64_t i = 0; i < block_size_; ++i) eat(static_cast<uint32_t>(tokens[i]));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

int32_t BlockAllocator::lookup(uint64_t key, const int32_t* tokens) {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const int32_t b = it->second;
  Cached& c = cached_.at(b);
  if (!std::equal(c.tokens.begin(), c.tokens.end(), tokens)) return -1;  // a collision of keys
  if (ref_[static_cast<size_t>(b)]++ == 0) lru_.erase(c.lru);
  return b;
}

bool BlockAllocator::register_block(int32_t b, uint64_t key, const int32_t* tokens) {
  if (b < 0 || b >= total() || ref_[static_cast<size_t>(b)] == 0) {
    throw InvalidArgument("KV pool: cannot register block " + std::to_string(b) + ": not allocated");
  }
  if (cached_.count(b) != 0 || by_key_.count(key) != 0) return false;
  Cached& c = cached_[b];
  c.key = key;
  c.tokens.assign(tokens, tokens + block_size_);
  by_key_.emplace(key, b);
  return true;
}

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

// ---- Engine ----

Engine::Engine(Model& model, const EngineOptions& o)
    : m_(model), o_(o),
      pools_((BlockAllocator::check_sizes(o.n_blocks, o.block_size),
              model.kv_pools(o.n_blocks, o.block_size, o.kv_dtype))),
      alloc_(o.n_blocks, o.block_size) {
  if (o.max_batch < 1 || o.max_waiting < 0 || o.prefill_chunk < 1) {
    throw InvalidArgument("engine: max_batch and prefill_chunk must be >= 1, max_waiting >= 0");
  }
  stats_.total_blocks = stats_.free_blocks = alloc_.total();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::shared_ptr<Sequence> Engine::submit(SeqRequest r) {
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
  if (r.grammar && (!r.masker || r.masker->vocab_size() != V)) {
    throw InvalidArgument("constrained output needs a token masker over the model's " + std::to_string(V) + " ids");
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

void Engine::finish(Running& r, Finish f, const std::string& error) {
  alloc_.release(r.blocks);
  ended_.push_back({r.seq, f, error});
}

void Engine::publish_ended() {
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

bool Engine::take(Running& r, const float* logits) {
  const int64_t V = m_.config().vocab_size;
  const uint8_t* allowed = nullptr;
  if (r.matcher) {
    // Constrained output: only the tokens the grammar allows; none left means the document is
    // complete (and the vocabulary has no end-of-sequence id to say so) or stuck.
    r.req.masker->allowed(*r.matcher, r.mask);
    const int64_t n = std::min<int64_t>(V, static_cast<int64_t>(r.mask.size()));
    r.mask.resize(static_cast<size_t>(V), 0);
    if (std::find(r.mask.begin(), r.mask.begin() + n, uint8_t{1}) == r.mask.begin() + n) {
      if (r.matcher->accepts_end()) {
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
  if (r.matcher && !r.req.masker->advance(*r.matcher, next)) {
    finish(r, Finish::kError, "constrained output: the sampler drew a token the grammar refuses");
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
  if (r.matcher && r.matcher->accepts_end() && r.matcher->allowed_bytes().none()) {
    finish(r, Finish::kStop);  // a whole document, and nothing may follow it
    return false;
  }
  if (r.generated >= r.req.max_tokens) {
    finish(r, Finish::kLength);
    return false;
  }
  return true;
}

void Engine::step(std::vector<std::unique_ptr<Running>>& running, std::vector<float>& logits) {
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
                               [](const auto& r) { return r->blocks.empty(); }),
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
      // The prefix cache: whole blocks of the prompt, but its last token (whose logits the
      // first draw needs), while earlier prompts had them. A request for the prompt's log
      // probabilities computes every position.
      if (o_.prefix_cache && !(req.prompt_logprobs && req.logprobs >= 0)) {
        const int64_t bs = alloc_.block_size();
        for (int64_t b = 0; b < (P - 1) / bs; ++b) {
          const int32_t* t = req.prompt.data() + b * bs;
          const uint64_t key = alloc_.key_of(r->key, t);
          const int32_t id = alloc_.lookup(key, t);
          if (id < 0) break;
          r->blocks.push_back(id);
          r->key = key;
        }
        r->registered = static_cast<int64_t>(r->blocks.size());
      }
      const int64_t have = static_cast<int64_t>(r->blocks.size());
      if (!alloc_.allocate(alloc_.blocks_for(span) - have, r->blocks)) {
        alloc_.release(r->blocks);  // back to the cache
        break;  // wait for blocks
      }
      r->prefilled = r->pos = have * alloc_.block_size();
      stats_.cached_prompt_tokens += r->prefilled;
      {
        std::lock_guard<std::mutex> sl(seq->mu_);
        seq->cached_tokens_ = r->prefilled;
      }
      r->seq = seq;
      r->req = std::move(req);
      r->sampler = std::make_unique<Sampler>(r->req.sampler);
      if (r->req.grammar) r->matcher.emplace(*r->req.grammar);
      running.push_back(std::move(r));
      waiting_.pop_front();
    }
    stats_.waiting = static_cast<int64_t>(waiting_.size());
  }
  // 3. Advance each running sequence by a decode step or a prompt chunk: the decode steps of
  // all sequences past their prompt together (one decode_paged: the products over the batch,
  // one paged attention call per layer), the prompt chunks one sequence at a time.
  int64_t budget = o_.prefill_chunk, advanced = 0, prompt_done = 0;
  std::vector<Running*> decoding;
  for (auto& r : running) {
    if (r->prefilled == static_cast<int64_t>(r->req.prompt.size()) && !r->blocks.empty()) {
      decoding.push_back(r.get());
    }
  }
  if (!decoding.empty()) {
    const int64_t n = static_cast<int64_t>(decoding.size()), V = m_.config().vocab_size;
    std::vector<int32_t> toks(static_cast<size_t>(n));
    int64_t stride = 1;
    for (const Running* r : decoding) {
      stride = std::max<int64_t>(stride, static_cast<int64_t>(r->blocks.size()));
    }
    tables_.assign(static_cast<size_t>(n * stride), -1);  // entries past a table: never read
    lens_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const Running& r = *decoding[static_cast<size_t>(i)];
      toks[static_cast<size_t>(i)] = r.last;
      std::copy(r.blocks.begin(), r.blocks.end(), tables_.begin() + i * stride);
      lens_[static_cast<size_t>(i)] = r.pos + 1;  // the new token's position + 1
    }
    const nn::PagedSeqs seqs{n, tables_.data(), stride, lens_.data()};
    batch_logits_.resize(static_cast<size_t>(n * V));
    try {
      m_.decode_paged(toks.data(), pools_, seqs, batch_logits_.data());
      for (int64_t i = 0; i < n; ++i) {
        Running& r = *decoding[static_cast<size_t>(i)];
        ++r.pos;
        take(r, &batch_logits_[static_cast<size_t>(i * V)]);
      }
    } catch (const std::exception& e) {
      for (Running* r : decoding) {
        if (!r->blocks.empty()) finish(*r, Finish::kError, e.what());
      }
    }
    advanced += n;
  }
  for (auto& r : running) {
    const int64_t P = static_cast<int64_t>(r->req.prompt.size());
    try {
      if (r->prefilled < P && !r->blocks.empty()) {
        if (budget <= 0) continue;
        const int64_t n = std::min(budget, P - r->prefilled);
        if (r->req.prompt_logprobs && r->req.logprobs >= 0) {
          // One position at a time: each position's logits give the next prompt token's.
          const int64_t V = m_.config().vocab_size;
          for (int64_t i = 0; i < n; ++i) {
            m_.prefill_paged(r->req.prompt.data() + r->prefilled, 1, pools_, r->blocks.data(),
                             static_cast<int64_t>(r->blocks.size()), r->pos, logits.data());
            ++r->prefilled;
            ++r->pos;
            if (r->prefilled < P) {
              TokenLogprob lp = logprob_of(logits.data(), V, 1.0, r->req.prompt[static_cast<size_t>(r->prefilled)],
                                           r->req.logprobs);
              std::lock_guard<std::mutex> lock(r->seq->mu_);
              r->seq->prompt_logprobs_.push_back(std::move(lp));
            }
          }
        } else {
          m_.prefill_paged(r->req.prompt.data() + r->prefilled, n, pools_, r->blocks.data(),
                           static_cast<int64_t>(r->blocks.size()), r->pos, logits.data());
          r->prefilled += n;
          r->pos += n;
        }
        // The prompt's blocks now whole go into the prefix cache.
        if (o_.prefix_cache) {
          const int64_t bs = alloc_.block_size();
          while ((r->registered + 1) * bs <= r->prefilled) {
            const int32_t* t = r->req.prompt.data() + r->registered * bs;
            r->key = alloc_.key_of(r->key, t);
            alloc_.register_block(r->blocks[static_cast<size_t>(r->registered)], r->key, t);
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
            take(*r, logits.data());
          }
        }
      }
    } catch (const std::exception& e) {
      finish(*r, Finish::kError, e.what());
    }
  }
  running.erase(std::remove_if(running.begin(), running.end(),
                               [](const auto& r) { return r->blocks.empty(); }),
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

void Engine::loop() {
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

}  // namespace diffattn::serve
