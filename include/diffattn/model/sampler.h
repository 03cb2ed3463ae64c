// Sampling the next token from logits: greedy, temperature, top-k, top-p, seeded by the
// project's one generator (include/diffattn/base/rng.h), so a seed names the same tokens on
// every standard library.
#pragma once

#include <cstdint>
#include <vector>

#include "diffattn/base/rng.h"

namespace diffattn {

struct SamplerOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // nucleus: smallest set with probability >= top_p
  uint64_t seed = 0;
  // The ids that may be drawn: below vocab_limit (0: every logit) and not in `excluded`
  // (sorted). A model's embedding often has more rows than its tokenizer has tokens (a padded
  // vocabulary): those ids have no text and are never drawn (data::restrict_to_tokens).
  int64_t vocab_limit = 0;
  std::vector<int32_t> excluded;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o);
  int32_t sample(const float* logits, int64_t V);

 private:
  SamplerOptions o_;
  Rng rng_;
  std::vector<int32_t> idx_;  // scratch, kept between calls: no allocation per token
  std::vector<double> p_;  // each token's weight (no limit, nucleus)
  std::vector<double> w_;  // the candidates' weights in order
  std::vector<float> masked_;  // the logits with the excluded ids at -inf
};

}  // namespace diffattn
