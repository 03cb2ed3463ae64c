// Sampling the next token from logits: greedy, temperature, top-k, top-p, seeded by the
// project's one generator (include/diffattn/base/rng.h), so a seed names the same tokens on
// every standard library; before the draw, OpenAI's logit_bias and presence / frequency
// penalties, and a mask of the ids that may come next (constrained output).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "diffattn/base/rng.h"

namespace diffattn::infer {

struct SamplerOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // nucleus: smallest set with probability >= top_p
  uint64_t seed = 0;
  // The ids that may be drawn: below vocab_limit (0: every logit) and not in `excluded`
  // (sorted). A model's embedding often has more rows than its tokenizer has tokens (a padded
  // vocabulary): those ids have no text and are never drawn (train::restrict_to_tokens).
  int64_t vocab_limit = 0;
  std::vector<int32_t> excluded{};
  // OpenAI's penalties over the ids this sampler has drawn: logit[id] -= count(id) *
  // frequency_penalty + (count(id) > 0) * presence_penalty. Each in [-2, 2].
  double presence_penalty = 0, frequency_penalty = 0;
  // Added to the logits of these ids (increasing ids, each once; values in [-100, 100]).
  std::vector<std::pair<int32_t, float>> logit_bias{};
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o);
  // Draws the next id from logits (V of them). allowed, when given (V entries): only ids with
  // allowed[id] != 0 may be drawn; at least one of them must be a drawable id.
  int32_t sample(const float* logits, int64_t V, const uint8_t* allowed = nullptr);
  // The logits the last draw was made from, before temperature, top-k and top-p: the model's,
  // with logit_bias added, the penalties subtracted and every id that may not be drawn
  // (vocab_limit, excluded, allowed) at -inf; last_vocab() of them. Valid until the next
  // sample() and while the logits given to it live (they may be the same memory).
  const float* last_logits() const { return last_; }
  int64_t last_vocab() const { return last_v_; }

 private:
  int32_t draw(const float* logits, int64_t V, const uint8_t* allowed);
  SamplerOptions o_;
  Rng rng_;
  std::vector<int32_t> idx_;  // scratch, kept between calls: no allocation per token
  std::vector<double> p_;  // each token's weight (no limit, nucleus)
  std::vector<double> w_;  // the candidates' weights in order
  std::vector<float> masked_;  // the logits adjusted (bias, penalties, excluded and masked ids)
  std::vector<int32_t> count_;  // times each id was drawn (with penalties only)
  std::vector<int32_t> seen_;   // the ids drawn, each once
  const float* last_ = nullptr;
  int64_t last_v_ = 0;
};

}  // namespace diffattn::infer
