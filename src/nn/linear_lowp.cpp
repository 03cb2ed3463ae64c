// Linear layers and embeddings with BF16/F16 weights kept in their stored type (nn.h): decode's
// few rows by the matrix-vector kernel (kernels/gemv.h: each weight streamed once per call for
// all rows, widened in registers; memory-bound: 2 bytes per weight instead of 4), split across
// threads here; prefill's many rows by sgemm on panels of the weight widened to float32 in
// per-thread scratch (compute-bound: the widening is O(OC C), 1/N of the product).
// Accumulation is float32 everywhere.
#include <cblas.h>

#include <algorithm>
#include <string>
#include <vector>

#include "diffattn/kernels/gemv.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/nn/layers.h"

namespace diffattn::nn {

namespace {

void check_lowp(DType t, const char* what) {
  if (t != DType::BF16 && t != DType::F16) {
    throw InvalidArgument(std::string(what) + ": unsupported weight dtype " +
                          std::to_string(static_cast<int>(t)));
  }
}

// Threads for a product of `work` weight elements: each gets at least kMinWork of them (a
// parallel region's start costs more than a small layer's product when another process holds
// a core; see SmallProductThreads in linear.cpp).
int threads_for(double work) {
  constexpr double kMinWork = 1 << 18;
  return static_cast<int>(std::clamp(work / kMinWork, 1.0, static_cast<double>(kernels::num_threads())));
}

// Weight rows per task of the matrix-vector kernel: a multiple of its register tile, small
// enough that two threads split even a 2048-row weight evenly.
constexpr int64_t kGemvRowBlock = 64;
// Weight rows widened per sgemm call: 128 rows of C = 2048 floats is a 1 MiB panel, about what
// sgemm packs at once anyway; N x 128 outputs per call keep its efficiency near a full product.
constexpr int64_t kPanelRows = 128;

}  // namespace

void linear_fwd_few_rows(float* out, const float* inp, TensorView weight, int64_t N, int64_t C,
                         int64_t OC, int64_t ldo) {
  if (ldo == 0) ldo = OC;
  // out (N, OC) = inp (N, C) @ W^T: tasks of kGemvRowBlock weight rows, statically split so
  // each thread streams one contiguous range of the weight.
  const int64_t blocks = (OC + kGemvRowBlock - 1) / kGemvRowBlock;
  const double work = static_cast<double>(OC) * static_cast<double>(C) * static_cast<double>(N);
  const int nt = static_cast<int>(std::min<int64_t>(threads_for(work), blocks));
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r0 = b * kGemvRowBlock, r1 = std::min(OC, r0 + kGemvRowBlock);
    kernels::gemv_rows(out, ldo, inp, weight.data, weight.dtype, N, C, r0, r1);
  }
}

void linear_fwd(float* out, const float* inp, TensorView weight, int64_t N, int64_t C, int64_t OC,
                int64_t ldo) {
  if (weight.dtype == DType::F32) {
    linear_fwd(out, inp, weight.f32(), N, C, OC, ldo);
    return;
  }
  check_lowp(weight.dtype, "linear_fwd");
  if (N <= 0 || OC <= 0) return;
  if (ldo == 0) ldo = OC;
  if (ldo < OC) {
    throw InvalidArgument("linear_fwd: output row stride " + std::to_string(ldo) +
                          " is less than the " + std::to_string(OC) + " output features");
  }
  if (C <= 0) {
    for (int64_t n = 0; n < N; ++n) std::fill(out + n * ldo, out + n * ldo + OC, 0.0f);
    return;
  }
  if (weight.data == nullptr) throw InvalidArgument("linear_fwd: the weight's data is null");
  const auto* W = static_cast<const uint16_t*>(weight.data);
  const double work = static_cast<double>(OC) * static_cast<double>(C);
  if (N <= kGemvMaxN16) return linear_fwd_few_rows(out, inp, weight, N, C, OC, ldo);
  // Panels of kPanelRows weight rows widened into this thread's scratch, then
  // out[:, r0:r1] (N, rows) = inp (N, C) @ panel^T on one thread (OpenBLAS's OpenMP build runs
  // single-threaded inside a parallel region). Dynamic: the last panel may be short.
  const int64_t panels = (OC + kPanelRows - 1) / kPanelRows;
  const int nt = static_cast<int>(std::min<int64_t>(threads_for(work * N / 8), panels));
  sync_blas_threads();
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    static thread_local std::vector<float> panel;
    panel.resize(static_cast<size_t>(kPanelRows * C));
#pragma omp for schedule(dynamic, 1)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t r0 = p * kPanelRows, rows = std::min(kPanelRows, OC - r0);
      convert_to_f32(panel.data(), W + r0 * C, weight.dtype, rows * C);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N),
                  static_cast<int>(rows), static_cast<int>(C), 1.0f, inp, static_cast<int>(C),
                  panel.data(), static_cast<int>(C), 0.0f, out + r0, static_cast<int>(ldo));
    }
  }
}

void embedding_fwd(float* out, const int32_t* tokens, TensorView table, int64_t N, int64_t C,
                   int64_t V) {
  if (table.dtype == DType::F32) {
    embedding_fwd(out, tokens, table.f32(), N, C, V);
    return;
  }
  check_lowp(table.dtype, "embedding_fwd");
  if (table.data == nullptr && N > 0 && C > 0) {
    throw InvalidArgument("embedding_fwd: the table's data is null");
  }
  const size_t row_bytes = dtype_size(table.dtype) * static_cast<size_t>(C);
  for (int64_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      throw InvalidArgument("embedding: token " + std::to_string(tokens[i]) + " at position " +
                            std::to_string(i) + " is outside the vocabulary [0, " +
                            std::to_string(V) + ")");
    }
    const auto* row = static_cast<const unsigned char*>(table.data) +
                      static_cast<size_t>(tokens[i]) * row_bytes;
    convert_to_f32(out + i * C, row, table.dtype, C);
  }
}

}  // namespace diffattn::nn
