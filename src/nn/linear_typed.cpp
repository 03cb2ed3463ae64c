// Linear layers and embeddings whose weights stay in their stored type (BF16, F16): panels of
// weight rows are converted to float32 into a per-thread buffer and multiplied by BLAS.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "diffattn/nn.h"

namespace diffattn::nn {

namespace {

const void* row_ptr(TypedPtr w, int64_t row, int64_t C) {
  return static_cast<const char*>(w.data) +
         static_cast<size_t>(row) * static_cast<size_t>(C) * dtype_size(w.dtype);
}

}  // namespace

void linear_fwd(float* out, const float* inp, TypedPtr w, int64_t N, int64_t C, int64_t OC,
                int64_t ldo) {
  if (w.dtype == DType::F32) {
    linear_fwd(out, inp, w.f32(), N, C, OC, ldo);
    return;
  }
  if (N == 0) return;
  const int64_t ld = ldo ? ldo : OC;
  // Panels of about 1 MiB of float32 weights, each multiplied into its column block of out.
  const int64_t panel = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(C, 1));
  static thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(std::min(panel, OC) * C));
  std::vector<float> col;
  for (int64_t r0 = 0; r0 < OC; r0 += panel) {
    const int64_t rows = std::min(panel, OC - r0);
    convert_to_f32(buf.data(), row_ptr(w, r0, C), w.dtype, rows * C);
    if (N == 1) {
      linear_fwd(out + r0, inp, buf.data(), 1, C, rows);
    } else {
      linear_fwd(out + r0, inp, buf.data(), N, C, rows, ld);
    }
  }
}

void bias_add(float* out, const float* bias, int64_t N, int64_t OC, int64_t ldo) {
  const int64_t ld = ldo ? ldo : OC;
  for (int64_t i = 0; i < N; ++i) {
    float* row = out + i * ld;
    for (int64_t j = 0; j < OC; ++j) row[j] += bias[j];
  }
}

void embedding_fwd(float* out, const int32_t* tokens, TypedPtr table, int64_t N, int64_t C,
                   int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      throw InvalidArgument("embedding: token " + std::to_string(tokens[i]) + " at position " +
                            std::to_string(i) + " is outside the vocabulary [0, " +
                            std::to_string(V) + ")");
    }
    convert_to_f32(out + i * C, row_ptr(table, tokens[i], C), table.dtype, C);
  }
}

}  // namespace diffattn::nn
