// The scheduler: continuous batching of many sequences over one model, through one inference
// session (Session) over a paged KV store (KvStore: one pool of fixed-size blocks per layer,
// each running sequence a sequence of the store, its table of block ids handed out by the
// store's BlockAllocator, with the prefix cache). `diffattn serve` runs its requests through
// it (src/serve), as does bench_serve_engine without HTTP.
//
// One thread (the scheduler's) owns the session and the store. Each step it
//   1. drops sequences that finished, were cancelled (client gone) or ran out of time, returning
//      their blocks to the pool;
//   2. admits waiting sequences, first come first served, while the batch has room and the pool
//      has the blocks for the sequence's whole span (prompt + max_tokens, so a running sequence
//      never runs out of cache);
//   3. advances every running sequence by one piece of work: a decode step (one token), or the
//      next chunk of its prompt (at most prefill_chunk tokens per step over all sequences, so
//      long prompts are interleaved with the running streams' tokens).
// Requests join and leave between steps. Submitting beyond max_waiting waiting sequences throws
// QueueFull (the server answers 503).
//
// The decode steps of a step run as one Session::decode call, a batch of one row per decoding
// sequence: every matrix product (attention projections, FFN, output head) is over the batch,
// so each weight is read once per step, and each layer's attention is one
// attention_paged call over all the decoding sequences, of different lengths, reading
// K/V in place from their blocks (no gather copy). A prompt chunk (a Session::decode call of
// the sequence's rows) writes its K/V into the sequence's blocks, and its attention reads the
// earlier positions in place as well (attention_paged with several query rows per sequence:
// the tiled forward packs its K/V tiles straight from the blocks).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "diffattn/base/error.h"
#include "diffattn/infer/batch.h"
#include "diffattn/infer/kv_store.h"
#include "diffattn/infer/session.h"
#include "diffattn/model/model.h"
#include "diffattn/infer/sampler.h"

namespace diffattn::infer {

class QueueFull : public Error {
 public:
  using Error::Error;
};

enum class Finish { kNone, kStop, kLength, kCancelled, kTimeout, kError };
const char* finish_name(Finish f);

// A token's log probability and the most likely tokens beside it (id, log probability), most
// likely first. A log probability of -inf (an id that could not be drawn) is -9999, as OpenAI
// writes it.
struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// The log-softmax of logits (V of them) at temperature T (1 when T is 0): id's, and the top
// `top` ids' (ties by id).
TokenLogprob logprob_of(const float* logits, int64_t V, double T, int32_t id, int64_t top);

// Constrained output, one per sequence: which ids may come next, and where the text stands as
// ids are taken. The server's JSON grammars implement it (src/serve); the scheduler knows no
// grammar.
class OutputConstraint {
 public:
  virtual ~OutputConstraint() = default;
  // mask[id] = 1 where id may come next, 0 elsewhere (mask is resized to the constraint's ids).
  virtual void allowed(std::vector<uint8_t>& mask) = 0;
  // Takes id; false when the constraint refuses it.
  virtual bool advance(int32_t id) = 0;
  // The ids so far make a whole document.
  virtual bool complete() const = 0;
  // complete(), and nothing may follow it.
  virtual bool closed() const = 0;
};

// What starts a sequence's constraint when the sequence is admitted; shared by requests.
class ConstraintSource {
 public:
  virtual ~ConstraintSource() = default;
  virtual int64_t vocab_size() const = 0;  // the ids its masks cover: the model's
  virtual std::unique_ptr<OutputConstraint> start() const = 0;
};

struct SeqRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplerOptions sampler;
  std::vector<int32_t> stop_ids;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // >= 0: each generated token's log probability with that many top ones: the log-softmax of
  // the logits the sampler drew from (after logit_bias, penalties and masks) at its
  // temperature (1 when greedy), before top-k and top-p.
  int64_t logprobs = -1;
  // With logprobs >= 0: also the prompt's tokens' (from the second on), under the model's own
  // distribution (the raw logits at temperature 1); the prompt's chunks then ask for every
  // row's logits.
  bool prompt_logprobs = false;
  // Constrained output: only the ids the sequence's constraint allows (null: any). A finished
  // document ends the sequence (kStop) when nothing may follow it.
  std::shared_ptr<const ConstraintSource> constraint;
};

// One sequence's progress, shared by the scheduler and the request's handler.
class Sequence {
 public:
  // Waits until more than `have` tokens exist, the sequence ended, or `timeout` passed; copies
  // the tokens from index `have` on into out. Returns the finish state (kNone: still running).
  Finish wait(size_t have, std::vector<int32_t>& out, std::chrono::milliseconds timeout);
  // The same, with the tokens' log probabilities (SeqRequest::logprobs >= 0) into lp.
  Finish wait(size_t have, std::vector<int32_t>& out, std::vector<TokenLogprob>& lp,
              std::chrono::milliseconds timeout);
  // The prompt's log probabilities (SeqRequest::prompt_logprobs), complete once the first token
  // exists: one per prompt token from the second on.
  std::vector<TokenLogprob> prompt_logprobs() const;
  // Asks the scheduler to stop the sequence and free its blocks (idempotent).
  void cancel();
  int64_t prompt_tokens() const { return prompt_len_; }
  // Prompt tokens whose K/V came from the prefix cache (known once the sequence is admitted).
  int64_t cached_tokens() const;
  std::string error() const;
  // Seconds from submission to the first token (< 0 before it).
  double ttft() const;

 private:
  friend class Scheduler;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::vector<TokenLogprob> logprobs_, prompt_logprobs_;
  Finish finish_ = Finish::kNone;
  std::string error_;
  bool cancel_ = false;
  int64_t prompt_len_ = 0;
  int64_t cached_tokens_ = 0;
  std::chrono::steady_clock::time_point submitted_, first_token_;
};

struct SchedulerOptions {
  int64_t block_size = 16;        // KV positions per block
  int64_t n_blocks = 4096;        // the pool
  int64_t max_batch = 64;         // running sequences
  int64_t max_waiting = 256;      // waiting sequences; more: QueueFull
  int64_t prefill_chunk = 512;    // prompt tokens per step, over all sequences
  DType kv_dtype = DType::F32;    // the pools' storage (BF16/F16: half the memory and traffic)
  // Automatic prefix caching: the whole blocks of a prompt (but its last token) are taken from
  // earlier sequences' blocks when the same tokens began their prompts, and the start of the
  // next block is copied from a cached block after the same prefix (BlockAllocator).
  bool prefix_cache = true;  // off for a recurrent model (its state is not in the blocks)
  // Called by the scheduler's thread before each step (0, 1, ...); tests hold it here to
  // make an interleaving (a cancel between two steps) certain instead of likely.
  std::function<void(int64_t step)> before_step;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0, free_blocks = 0, total_blocks = 0;
  int64_t steps = 0, prompt_tokens = 0, generated_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens taken from the prefix cache
  int64_t cached_blocks = 0;         // blocks registered in the prefix cache
  double last_batch = 0;  // sequences advanced in the last step
};

class Scheduler {
 public:
  // The model must outlive the scheduler; its thread only reads it.
  Scheduler(const model::Model& model, const SchedulerOptions& o);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a sequence. Throws InvalidArgument when it cannot ever run (empty prompt, prompt +
  // max_tokens beyond the model's max_seq_len or the whole pool), QueueFull when max_waiting
  // sequences already wait, Error after shutdown().
  std::shared_ptr<Sequence> submit(SeqRequest r);
  // Cancels everything queued and running and stops the thread.
  void shutdown();
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return o_; }

 private:
  struct Running {
    std::shared_ptr<Sequence> seq;
    SeqRequest req;
    int32_t id = -1;        // its sequence in the KV store (block table, positions held)
    bool ended = false;     // finished: its sequence closed, its blocks released
    int64_t prefilled = 0;  // prompt tokens in the cache
    int64_t registered = 0;  // its first blocks registered in (or taken from) the prefix cache
    uint64_t key = BlockAllocator::kRootKey;  // the key of its last registered block
    int64_t generated = 0;
    int32_t last = -1;      // the token to feed next (after the prefill)
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<OutputConstraint> constraint;  // constrained output
    std::vector<uint8_t> mask;
  };
  void loop();
  void step(std::vector<std::unique_ptr<Running>>& running, std::vector<float>& logits);
  // Ends r: its blocks go back to the pool at once; the sequence learns of it in
  // publish_ended(), after the step has updated the stats, so a client that sees its sequence
  // end also sees its blocks free in stats().
  void finish(Running& r, Finish f, const std::string& error = "");
  void publish_ended();
  // Samples from logits, records the token; returns false when the sequence ended.
  bool take(Running& r, const float* logits);

  const model::Model& m_;
  SchedulerOptions o_;
  // The store first: a pool that cannot fit is refused (with its size) before anything else.
  KvStore kv_;
  BlockAllocator& alloc_;  // kv_'s
  Session session_;
  Batch batch_;  // a step's rows, reused
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<Sequence>, SeqRequest>> waiting_;
  bool stop_ = false;
  SchedulerStats stats_;
  std::vector<float> batch_logits_;  // (batch, V) of a decode step
  struct Ended {
    std::shared_ptr<Sequence> seq;
    Finish how;
    std::string error;
  };
  std::vector<Ended> ended_;  // finished in this step, not yet told (the scheduler thread only)
  std::thread thread_;
};

}  // namespace diffattn::infer
