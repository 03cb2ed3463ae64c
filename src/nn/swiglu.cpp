// SwiGLU feed-forward activation, silu(gate) * up, and the per-token sigmoid of V2's lambda.
// Element-wise, so rows run in parallel without any reduction.
#include <cmath>

#include "diffattn/nn/layers.h"
#include "nn/fastmath.h"

namespace diffattn::nn {

void swiglu_fwd(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                int64_t ldg) {
  if (!ldg) ldg = F;
#pragma omp parallel for schedule(static) if (N * F >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = gate + i * ldg;
    const float* u = up + i * ldg;
    float* o = out + i * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) o[f] = g[f] * sigmoid_fast(g[f]) * u[f];
  }
}

void polynorm_fwd(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                  int64_t ldg, const float* w, const float* b, float eps) {
  if (!ldg) ldg = F;
#pragma omp parallel for schedule(static) if (N * F >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = gate + i * ldg;
    const float* u = up + i * ldg;
    float* o = out + i * F;
    // mean(z^2), mean(z^4), mean(z^6): the squares of z, z^2, z^3
    double s2 = 0, s4 = 0, s6 = 0;
#pragma omp simd reduction(+ : s2, s4, s6)
    for (int64_t f = 0; f < F; ++f) {
      const double z = g[f], z2 = z * z;
      s2 += z2;
      s4 += z2 * z2;
      s6 += z2 * z2 * z2;
    }
    const double n = static_cast<double>(F);
    const float c1 = static_cast<float>(w[2] / std::sqrt(s2 / n + eps));
    const float c2 = static_cast<float>(w[1] / std::sqrt(s4 / n + eps));
    const float c3 = static_cast<float>(w[0] / std::sqrt(s6 / n + eps));
    const float bias = b[0];
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float z = g[f];
      o[f] = (((c3 * z + c2) * z + c1) * z + bias) * u[f];
    }
  }
}

void swiglu_bwd(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                int64_t N, int64_t F, int64_t ldg) {
  if (!ldg) ldg = F;
#pragma omp parallel for schedule(static) if (N * F >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = gate + i * ldg;
    const float* u = up + i * ldg;
    const float* d = dout + i * F;
    float* dg = dgate + i * ldg;
    float* du = dup + i * ldg;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      // silu(g) = g s(g);  silu'(g) = s(g) (1 + g (1 - s(g)))
      const float s = sigmoid_fast(g[f]);
      du[f] += d[f] * g[f] * s;
      dg[f] += d[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
    }
  }
}

void sigmoid_fwd(float* out, const float* inp, int64_t N, int64_t H, int64_t ldi) {
#pragma omp parallel for schedule(static) if (N * H >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t h = 0; h < H; ++h) out[i * H + h] = sigmoid_fast(inp[i * ldi + h]);
  }
}

void sigmoid_bwd(float* dinp, const float* dout, const float* out, int64_t N, int64_t H,
                 int64_t ldi) {
#pragma omp parallel for schedule(static) if (N * H >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      const float s = out[i * H + h];
      dinp[i * ldi + h] += dout[i * H + h] * s * (1.0f - s);
    }
  }
}

}  // namespace diffattn::nn
