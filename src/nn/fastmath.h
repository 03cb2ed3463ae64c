// A vectorisable float exp for the element-wise layers (SwiGLU, sigmoid): no libm call, so a
// `#pragma omp simd` loop compiles to SIMD code. Accuracy about 1 ulp over the float range,
// like libm's expf, which these layers used before (the PyTorch comparison tests hold it to the
// error of a naive float32 computation).
#pragma once

#include <cstdint>
#include <cstring>

namespace diffattn::nn {

#pragma omp declare simd notinbranch
inline float exp_fast(float x) {
  // exp(x) = 2^n e^r with n = round(x / ln 2) and |r| <= ln2 / 2; ln 2 split in two parts
  // (Cody-Waite) so n * ln2 is exact enough that r keeps its low bits.
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float t = x * 1.44269504088896341f;
  const int32_t n = static_cast<int32_t>(t + (t >= 0.0f ? 0.5f : -0.5f));
  const float fn = static_cast<float>(n);
  const float r = (x - fn * 0.693359375f) + fn * 2.12194440e-4f;
  // Taylor series of e^r to degree 7: the first omitted term, r^8 / 8!, is below 1e-8.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (n + 127) << 23;  // 2^n, n in [-126, 127] after the clamp
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

#pragma omp declare simd notinbranch
inline float sigmoid_fast(float x) { return 1.0f / (1.0f + exp_fast(-x)); }

}  // namespace diffattn::nn
