// Linear layers and embeddings with BF16/F16 weights kept in their stored type (nn.h): decode's
// few rows by a matrix-vector kernel that streams each weight once per call for all rows, widening
// in registers (memory-bound: 2 bytes per weight instead of 4); prefill's many rows by sgemm on
// panels of the weight widened to float32 in per-thread scratch (compute-bound: the widening is
// O(OC C), 1/N of the product). Accumulation is float32 everywhere. Compiled by Highway for
// AVX-512, AVX2 (F16C) and a portable fallback, chosen at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "nn/linear_lowp.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "diffattn/kernels/runtime.h"
#include "diffattn/nn/layers.h"
#include "kernels/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::nn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// How a weight of type T is stored: float32 as float, BF16 and F16 as their 16 bits.
template <DType T>
using WElem = std::conditional_t<T == DType::F32, float, uint16_t>;

// Lanes(DF) weights from p (any alignment) widened to float32.
template <DType T>
HWY_INLINE VF LoadWeights(DF df, const WElem<T>* HWY_RESTRICT p) {
  if constexpr (T == DType::F32) {
    return hn::LoadU(df, p);
  } else if constexpr (T == DType::BF16) {
    const hn::RebindToUnsigned<DF> du32;
    const hn::Rebind<uint16_t, DF> du16;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, p))));
  } else {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  }
}

template <DType T>
HWY_INLINE float WidenOne(const WElem<T>* p) {
  if constexpr (T == DType::F32) return *p;
  uint16_t h;
  std::memcpy(&h, p, 2);
  return T == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// Register tile: R output rows (weight rows) by M input rows; R * M accumulators, R widened
// weight vectors and one input vector live at once (32 registers with AVX-512, 16 with AVX2).
// 4 x 6 (29 of AVX-512's registers) beat 4 x 4 by 10-20 % at N = 16 on Zen 4 (bench_linear_lowp
// --few 16, the 1B shape's 8192 x 2048 and 2048 x 8192, same-run ratios to sgemm 2.85-3.09
// against 2.73-2.80); 2 x 8, 3 x 8, 2 x 12, 5 x 5 and 6 x 4 were slower. With AVX2's 16
// registers, 3 x 4 (all 16) beat the former 4 x 2 on Zen 3 (bench_linear_lowp --few 8,32, one
// thread, 1B shapes, two alternated runs, ratio to the same run's sgemm): BF16 N = 8 2.85-3.98
// against 2.42-2.90, N = 32 1.49-1.87 against 1.27-1.45; 2 x 6 and 2 x 5 were between.
struct GemvTiles {
  static constexpr int kR = HWY_MAX_BYTES >= 64 ? 4 : 3;
  static constexpr int kM = HWY_MAX_BYTES >= 64 ? 6 : 4;
  static_assert(kR * kM + kR + 1 <= (HWY_MAX_BYTES >= 64 ? 32 : 16), "tile exceeds the registers");
};

// out[m * ldo + r] = sum_c W[r, c] x[m, c] for r < R, m < M. W (R, C) rows at stride C,
// x (M, C) rows at stride C. Each weight vector is widened once and used for all M rows.
// next: a later tile's R weight rows (same stride), asked for from memory one line per row
// per step, or null when they are already on their way (the later groups of input rows).
template <DType T, int R, int M>
HWY_NOINLINE void GemvTile(float* HWY_RESTRICT out, int64_t ldo, const float* HWY_RESTRICT x,
                           const WElem<T>* HWY_RESTRICT W, int64_t C,
                           const WElem<T>* HWY_RESTRICT next) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = hn::Zero(df);
  int64_t c = 0;
  for (; c + L <= C; c += L) {
    if (next != nullptr && (c * static_cast<int64_t>(sizeof(WElem<T>))) % 64 == 0) {
      for (int r = 0; r < R; ++r) __builtin_prefetch(next + r * C + c, 0, 3);
    }
    VF w[R];
    for (int r = 0; r < R; ++r) w[r] = LoadWeights<T>(df, W + r * C + c);
    for (int m = 0; m < M; ++m) {
      const VF xv = hn::LoadU(df, x + m * C + c);
      for (int r = 0; r < R; ++r) acc[r][m] = hn::MulAdd(w[r], xv, acc[r][m]);
    }
  }
#if HWY_TARGET == HWY_SCALAR
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < M; ++m) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[r][m]));
      for (int64_t t = c; t < C; ++t) s += WidenOne<T>(W + r * C + t) * x[m * C + t];
      out[m * ldo + r] = s;
    }
  }
#else
  // The R * M sums, Lanes at a time (accumulator i = m * R + r, zeros past the last), by the
  // tree of SumsOfLanes (kernels/simd-inl.h) instead of a horizontal sum per accumulator (a
  // third of the tile's work at C = 256, the small models' width).
  constexpr int kN = static_cast<int>(hn::MaxLanes(DF()));
  constexpr int kAcc = R * M, kGroups = (kAcc + kN - 1) / kN;
  HWY_DASSERT(static_cast<int>(hn::Lanes(df)) == kN);  // fixed-width targets only
  HWY_ALIGN float sums[kGroups * kN];
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
    VF t[kN];
#pragma GCC unroll 16
    for (int j = 0; j < kN; ++j) {
      const int i = g * kN + j;
      t[j] = i < kAcc ? acc[i % R][i / R] : hn::Zero(df);
    }
    hn::Store(diffattn::kernels::HWY_NAMESPACE::SumsOfLanes(df, t), df, sums + g * kN);
  }
  for (int m = 0; m < M; ++m) {
    for (int r = 0; r < R; ++r) {
      float s = sums[m * R + r];
      for (int64_t t = c; t < C; ++t) s += WidenOne<T>(W + r * C + t) * x[m * C + t];
      out[m * ldo + r] = s;
    }
  }
#endif
}

// out[r] = W[r, :] . x for one input row (decode): rows in order, so the weight is read as one
// sequential stream; four accumulators hide the FMA latency.
template <DType T>
HWY_NOINLINE void GemvOneRow(float* HWY_RESTRICT out, const float* HWY_RESTRICT x,
                             const WElem<T>* HWY_RESTRICT W, int64_t C, int64_t r0, int64_t r1) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = r0; r < r1; ++r) {
    const WElem<T>* w = W + r * C;
    VF a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 4 * L <= C; c += 4 * L) {
      a0 = hn::MulAdd(LoadWeights<T>(df, w + c), hn::LoadU(df, x + c), a0);
      a1 = hn::MulAdd(LoadWeights<T>(df, w + c + L), hn::LoadU(df, x + c + L), a1);
      a2 = hn::MulAdd(LoadWeights<T>(df, w + c + 2 * L), hn::LoadU(df, x + c + 2 * L), a2);
      a3 = hn::MulAdd(LoadWeights<T>(df, w + c + 3 * L), hn::LoadU(df, x + c + 3 * L), a3);
    }
    for (; c + L <= C; c += L) a0 = hn::MulAdd(LoadWeights<T>(df, w + c), hn::LoadU(df, x + c), a0);
    float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
    for (; c < C; ++c) s += WidenOne<T>(w + c) * x[c];
    out[r] = s;
  }
}

// GemvTile<T, R, n> for a run-time n <= M (the input rows left after the full tiles).
template <DType T, int R, int M>
HWY_INLINE void GemvTileRest(int64_t n, float* out, int64_t ldo, const float* x, const WElem<T>* W,
                             int64_t C, const WElem<T>* next) {
  if constexpr (M > 0) {
    if (n == M) return GemvTile<T, R, M>(out, ldo, x, W, C, next);
    GemvTileRest<T, R, M - 1>(n, out, ldo, x, W, C, next);
  }
}

// Rows [r0, r1) of the weight against all N input rows, in tiles of kR weight rows: the tile's
// weight rows (R * C * 2 bytes) come from memory once and from cache for the later groups of kM
// input rows.
template <DType T>
void GemvRows(float* out, int64_t ldo, const float* x, const WElem<T>* W, int64_t N, int64_t C,
              int64_t r0, int64_t r1) {
  constexpr int kR = GemvTiles::kR, kM = GemvTiles::kM;
  if (N == 1) return GemvOneRow<T>(out, x, W, C, r0, r1);
  // The first group of input rows asks for the weight rows two tiles on (within [r0, r1)) while
  // it computes, and the first two tiles are asked for here: the weights of a model larger than
  // the L2 come from memory once per step, and without the requests the tiles waited on them
  // (a 768 x 256 product, N = 16, one thread: 83 GFLOP/s with the weight in L2, 38-40 with 25
  // or 60 such weights in turn; 44-49 asking two tiles ahead, 40-46 one, 40-42 four).
  for (int64_t r = r0; r < std::min(r1, r0 + 2 * kR); ++r) {
    const auto* row = reinterpret_cast<const char*>(W + r * C);
    for (int64_t b = 0; b < C * static_cast<int64_t>(sizeof(WElem<T>)); b += 64) {
      __builtin_prefetch(row + b, 0, 3);
    }
  }
  auto tile = [&](auto r_const, int64_t r) {
    constexpr int R = decltype(r_const)::value;
    const WElem<T>* w = W + r * C;
    const WElem<T>* next = r + 3 * R <= r1 ? w + 2 * R * C : nullptr;
    int64_t m = 0;
    for (; m + kM <= N; m += kM, next = nullptr) {
      GemvTile<T, R, kM>(out + m * ldo + r, ldo, x + m * C, w, C, next);
    }
    if (m < N) GemvTileRest<T, R, kM - 1>(N - m, out + m * ldo + r, ldo, x + m * C, w, C, next);
  };
  int64_t r = r0;
  for (; r + kR <= r1; r += kR) tile(std::integral_constant<int, kR>{}, r);
  for (; r < r1; ++r) tile(std::integral_constant<int, 1>{}, r);
}

void Gemv(float* out, int64_t ldo, const float* x, const void* W, DType t, int64_t N, int64_t C,
          int64_t r0, int64_t r1) {
  if (t == DType::F32) return GemvRows<DType::F32>(out, ldo, x, static_cast<const float*>(W), N, C, r0, r1);
  const auto* w = static_cast<const uint16_t*>(W);
  if (t == DType::BF16) {
    GemvRows<DType::BF16>(out, ldo, x, w, N, C, r0, r1);
  } else {
    GemvRows<DType::F16>(out, ldo, x, w, N, C, r0, r1);
  }
}

}  // namespace diffattn::nn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace diffattn::nn {

HWY_EXPORT(Gemv);

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
    HWY_DYNAMIC_DISPATCH(Gemv)(out, ldo, inp, weight.data, weight.dtype, N, C, r0, r1);
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
#endif  // HWY_ONCE
