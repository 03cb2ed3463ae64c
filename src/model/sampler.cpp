// Sampling the next token: temperature, top-k, top-p (nucleus), seeded; temperature 0 is
// greedy (the first maximum wins ties).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "diffattn/base/error.h"
#include "diffattn/model/sampler.h"

namespace diffattn {

Sampler::Sampler(const SamplerOptions& o) : o_(o), rng_(o.seed) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw InvalidArgument("sampler: temperature must be >= 0, got " + std::to_string(o.temperature));
  }
  if (o.top_k < 0) throw InvalidArgument("sampler: top_k must be >= 0, got " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    throw InvalidArgument("sampler: top_p must be in (0, 1], got " + std::to_string(o.top_p));
  }
}

int32_t Sampler::sample(const float* logits, int64_t V) {
  if (o_.temperature == 0.0) {
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  }
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  // Highest logits first; ties by index, so the order is fully determined.
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t n = idx.size();
  if (o_.top_k > 0) n = std::min(n, static_cast<size_t>(o_.top_k));
  std::vector<double> p(n);
  const double mx = logits[idx[0]];
  double z = 0;
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::exp((logits[idx[i]] - mx) / o_.temperature);
    z += p[i];
  }
  if (o_.top_p < 1.0) {
    double c = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      c += p[i] / z;
      if (c >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    z = 0;
    for (size_t i = 0; i < n; ++i) z += p[i];
  }
  const double u = rng_.uniform() * z;  // the library's RNG: the same draw everywhere
  double c = 0;
  for (size_t i = 0; i < n; ++i) {
    c += p[i];
    if (u < c) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace diffattn
