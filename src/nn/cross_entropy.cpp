// Cross-entropy of logits against target tokens, with the row log-sum-exp saved for the
// backward. Sums in double; m is the row max, so every exp(l - m) <= 1.
#include <algorithm>
#include <cmath>
#include <string>

#include "diffattn/nn/layers.h"

namespace diffattn::nn {

void cross_entropy_fwd(float* losses, float* lse, const float* logits, const int32_t* targets,
                       int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] >= V) {
      throw InvalidArgument("cross_entropy: target " + std::to_string(targets[i]) +
                            " at position " + std::to_string(i) + " is outside [0, " +
                            std::to_string(V) + ")");
    }
  }
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* l = logits + i * V;
    const float m = *std::max_element(l, l + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(l[v]) - m);
    const double z = m + std::log(sum);
    lse[i] = static_cast<float>(z);
    losses[i] = targets[i] < 0 ? 0.0f : static_cast<float>(z - l[targets[i]]);
  }
}

void cross_entropy_bwd(float* dlogits, const float* logits, const float* lse,
                       const int32_t* targets, float dloss, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* l = logits + i * V;
    float* d = dlogits + i * V;
    if (targets[i] < 0) {
      for (int64_t v = 0; v < V; ++v) d[v] = 0.0f;
      continue;
    }
    for (int64_t v = 0; v < V; ++v) d[v] = dloss * std::exp(l[v] - lse[i]);
    d[targets[i]] -= dloss;
  }
}

}  // namespace diffattn::nn
