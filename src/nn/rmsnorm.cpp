// RMSNorm (Zhang & Sennrich, 2019): y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// Row sums in double; the weight gradient is reduced over fixed blocks of rows, then the
// blocks in order, so the result does not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "diffattn/nn/layers.h"

namespace diffattn::nn {

namespace {
constexpr int64_t kRowBlock = 64;  // rows per partial sum of dweight
}

void rmsnorm_fwd(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                 int64_t C, float eps, int64_t ldi, int64_t ldo) {
  if (!ldi) ldi = C;
  if (!ldo) ldo = C;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * ldi;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    float* y = out + i * ldo;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
    rstd[i] = r;
  }
}

void rmsnorm_bwd(float* dinp, float* dweight, const float* dout, const float* inp,
                 const float* weight, const float* rstd, int64_t N, int64_t C, int64_t ldd,
                 int64_t ldi) {
  if (!ldd) ldd = C;
  if (!ldi) ldi = C;
  const int64_t nblocks = (N + kRowBlock - 1) / kRowBlock;
  std::vector<double> partial(static_cast<size_t>(nblocks * C), 0.0);
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    double* pw = &partial[static_cast<size_t>(blk * C)];
    for (int64_t i = blk * kRowBlock; i < std::min(N, (blk + 1) * kRowBlock); ++i) {
      const float* x = inp + i * ldi;
      const float* dy = dout + i * ldd;
      const double r = rstd[i];
      // y = x r w:  dx = r (dy w) - r^3 / C * x * sum(dy w x)
      double dot = 0;  // in order, in double: the one reduction along the row
      for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dy[c]) * weight[c] * x[c];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) pw[c] += static_cast<double>(dy[c]) * x[c] * r;
      const float rf = static_cast<float>(r);
      const float k = static_cast<float>(r * r * r * dot / static_cast<double>(C));
      float* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] += rf * dy[c] * weight[c] - k * x[c];
    }
  }
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] += static_cast<float>(partial[static_cast<size_t>(blk * C + c)]);
    }
  }
}

}  // namespace diffattn::nn
