// The matrix-vector products of few input rows against a weight kept in its stored type
// (kernels/gemv.h): each weight vector widened once in registers and used for all rows. Compiled
// by Highway for AVX-512, AVX2 (F16C) and a portable fallback, chosen at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemv.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "diffattn/base/dtype.h"
#include "diffattn/kernels/gemv.h"
#include "kernels/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::kernels::HWY_NAMESPACE {
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
    hn::Store(SumsOfLanes(df, t), df, sums + g * kN);
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

}  // namespace diffattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();


#if HWY_ONCE
namespace diffattn::kernels {

HWY_EXPORT(Gemv);

void gemv_rows(float* out, int64_t ldo, const float* x, const void* w, DType t, int64_t N, int64_t C,
               int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(Gemv)(out, ldo, x, w, t, N, C, r0, r1);
}

}  // namespace diffattn::kernels
#endif  // HWY_ONCE
