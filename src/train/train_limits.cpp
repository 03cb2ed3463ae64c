// Bounds on a training run's options, checked before anything is allocated: every count in
// range, B * T * accum computed with overflow checks, and the activation memory a training step
// needs estimated and compared with this machine's memory, so a huge --batch is an error that
// names it instead of a wrapped size (a buffer overrun) or a bare std::bad_alloc.
#include <string>

#include "diffattn/base/memory.h"
#include "diffattn/train/train.h"

namespace diffattn::train {

namespace {

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw InvalidArgument(what + " overflows 64 bits");
  return r;
}

}  // namespace

int64_t train_step_bytes(const model::ModelConfig& c, int64_t batch, int64_t seq_len) {
  const std::string what = "train: batch (" + std::to_string(batch) + ") x seq_len (" +
                           std::to_string(seq_len) + ")";
  const int64_t N = checked_mul(batch, seq_len, what);
  const int64_t C = c.d_model, F = c.ffn_dim, V = c.vocab_size;
  const int64_t q = 2 * c.n_heads * c.head_dim + 4 * c.n_kv_heads * c.head_dim;  // q, k, v widths
  // Floats kept per token: per layer x_in, an, x_mid, fn, attn_out (5C), gate/up and h (3F),
  // the attention's q, k, v, output and statistics (~q + 2C); then logits and their gradient
  // (2V) and the backward's scratch (4C + 3F). An estimate within a small factor is enough.
  const int64_t per_token = c.n_layers * (7 * C + 3 * F + q) + 2 * V + 4 * C + 3 * F + 8;
  return checked_mul(checked_mul(N, per_token, what + " x floats per token"), 4,
                     what + " x 4 bytes");
}

void check_train_options(const TrainOptions& o, const model::ModelConfig& cfg) {
  auto range = [](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) {
      throw InvalidArgument(std::string("train: ") + key + " must be between " + std::to_string(lo) +
                            " and " + std::to_string(hi) + ", got " + std::to_string(v));
    }
  };
  const int64_t big = int64_t{1} << 40;
  range("steps", o.steps, 1, big);
  range("batch", o.batch, 1, big);
  range("seq_len", o.seq_len, 1, cfg.max_seq_len);
  range("accum", o.accum, 1, big);
  range("warmup", o.adamw.warmup, 0, big);
  range("eval_every", o.eval_every, 0, big);
  range("eval_batches", o.eval_batches, 1, big);
  range("save_every", o.save_every, 0, big);
  auto positive = [](const char* key, double v, bool zero_ok) {
    if (!(v > 0 || (zero_ok && v == 0)) || v > 1e30) {
      throw InvalidArgument(std::string("train: ") + key + " must be " +
                            (zero_ok ? "at least 0" : "greater than 0") + " and finite, got " +
                            std::to_string(v));
    }
  };
  positive("lr", o.adamw.lr, false);
  positive("min_lr", o.adamw.min_lr, true);
  positive("weight_decay", o.adamw.weight_decay, true);
  positive("clip", o.adamw.clip, true);
  positive("eps", o.adamw.eps, false);
  if (!(o.adamw.beta1 >= 0 && o.adamw.beta1 < 1) || !(o.adamw.beta2 >= 0 && o.adamw.beta2 < 1)) {
    throw InvalidArgument("train: beta1 and beta2 must be in [0, 1), got " +
                          std::to_string(o.adamw.beta1) + " and " + std::to_string(o.adamw.beta2));
  }
  // step * accum + micro numbers the batches: it must not wrap.
  checked_mul(o.steps, o.accum, "train: steps (" + std::to_string(o.steps) + ") x accum (" +
                                    std::to_string(o.accum) + ")");
  const int64_t need = train_step_bytes(cfg, o.batch, o.seq_len);
  // The machine's (and this process's) memory, as every size from outside input is checked.
  try {
    check_fits_in_memory(static_cast<double>(need),
                         "train: batch " + std::to_string(o.batch) + " x seq_len " +
                             std::to_string(o.seq_len) + " (activations of one micro-batch)");
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(e.what()) +
                          "; lower batch (use accum for larger steps) or seq_len");
  }
}

void Trainer::set_schedule(int64_t steps, int64_t eval_every, int64_t eval_batches,
                           int64_t save_every) {
  TrainOptions o = opts_;
  o.steps = steps;
  o.eval_every = eval_every;
  o.eval_batches = eval_batches;
  o.save_every = save_every;
  check_train_options(o, model_->config());
  opts_ = o;
  opts_.adamw.total_steps = steps;
}

}  // namespace diffattn::train
