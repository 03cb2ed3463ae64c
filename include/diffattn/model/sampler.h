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
};

}  // namespace diffattn
