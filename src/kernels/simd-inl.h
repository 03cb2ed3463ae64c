// SIMD building blocks of the fused kernels, compiled once per target by Highway
// (foreach_target.h re-includes this file): a fast exp2, the register-blocked micro-kernel
// C += A B, and the online-softmax update of one row of scores.
// Include it from a file that defines HWY_TARGET_INCLUDE, after hwy/highway.h.

#if defined(DIFFATTN_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DIFFATTN_SIMD_INL_H_
#undef DIFFATTN_SIMD_INL_H_
#else
#define DIFFATTN_SIMD_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "kernels/fused_traits.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// The register blocking of this target (fused_traits.h).
#if HWY_TARGET <= HWY_AVX3
using Micro = fused::MicroTile<32>;
#else
using Micro = fused::MicroTile<16>;
#endif

inline constexpr float kLog2e = 1.44269504088896340736f;
inline constexpr float kLn2 = 0.69314718055994530942f;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^x with a relative error of about 1e-7 (measured: 1.0e-7 over [-126, 10]) for x in
// [-126.5, 127]; exactly 0 below -126.5, so a masked score of -inf gives a weight of 0 (and
// weights under 2^-126, below the smallest normal float, vanish). NaN gives NaN (a NaN or
// Inf in q or k makes a NaN score, which must reach the output, not be clamped to 0 or 2^127). x = n + f with
// n = round(x), |f| <= 1/2; 2^f by a degree-6 polynomial (the minimax coefficients of
// Cephes' exp2f), 2^n by building the float's exponent field.
HWY_INLINE VF Exp2(DF d, VF x_in) {
  const VF x = hn::Min(hn::Max(x_in, hn::Set(d, -127.0f)), hn::Set(d, 127.0f));
  const VF n = hn::Round(x);
  const VF f = hn::Sub(x, n);
  VF p = hn::Set(d, 1.535336188319500e-4f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.339887440266574e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.618437357674640e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.550332471162809e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.402264791363012e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.931472028550421e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  const hn::RebindToSigned<DF> di;
  // n in [-127, 127]: n + 127 in [0, 254] is a valid biased exponent; 0 encodes +0.0.
  const auto bits = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  const VF y = hn::Mul(p, hn::BitCast(d, bits));
  return hn::IfThenElse(hn::IsNaN(x_in), x_in, y);
}

// The micro-kernel: C (MR x NV vectors) = [C * row_scale] + A (MR x k) B (k x NV vectors).
// A's element (r, kk) is a[r * a_rs + kk * a_cs] (so A or A^T of a row-major buffer), B's
// row kk starts at b + kk * ldb, C's row r at c + r * ldc. accumulate == false starts from 0;
// row_scale (may be null) multiplies the loaded C rows (the online-softmax rescale).
// The k products are summed in registers from zero and only then added to C: a C that
// accumulates over many calls (dK, dV over every query row of a group; O over every key tile)
// is a sum of k-term partials, so its rounding grows with calls + k, not calls * k.
template <int MR, int NV>
HWY_INLINE void MicroKernel(DF d, size_t kdim, const float* HWY_RESTRICT a, size_t a_rs,
                            size_t a_cs, const float* HWY_RESTRICT b, size_t ldb,
                            float* HWY_RESTRICT c, size_t ldc, bool accumulate,
                            const float* HWY_RESTRICT row_scale) {
  const size_t N = hn::Lanes(d);
  VF acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  }
  for (size_t kk = 0; kk < kdim; ++kk) {
    VF bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = hn::LoadU(d, b + kk * ldb + v * N);
    const float* ak = a + kk * a_cs;
    for (int r = 0; r < MR; ++r) {
      const VF av = hn::Set(d, ak[r * a_rs]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  if (accumulate && row_scale) {
    for (int r = 0; r < MR; ++r) {
      const VF s = hn::Set(d, row_scale[r]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(hn::LoadU(d, c + r * ldc + v * N), s, acc[r][v]);
    }
  } else if (accumulate) {
    for (int r = 0; r < MR; ++r) {
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::Add(hn::LoadU(d, c + r * ldc + v * N), acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[r][v], d, c + r * ldc + v * N);
  }
}

// C (rows x cols) = [C * row_scale] + A (rows x kdim) B (kdim x cols), tiled into
// micro-kernels. rows % kRowPad == 0 and cols % Lanes == 0 (callers pad their buffers).
HWY_INLINE void Gemm(size_t rows, size_t cols, size_t kdim, const float* a, size_t a_rs,
                     size_t a_cs, const float* b, size_t ldb, float* c, size_t ldc,
                     bool accumulate, const float* row_scale = nullptr) {
  const DF d;
  const size_t N = hn::Lanes(d);
  constexpr int MR = Micro::kMR, NV = Micro::kNV;
  const size_t nvec = cols / N;
  for (size_t r = 0; r < rows; r += MR) {
    const float* ar = a + r * a_rs;
    float* cr = c + r * ldc;
    const float* rs = row_scale ? row_scale + r : nullptr;
    size_t v = 0;
    for (; v + NV <= nvec; v += NV) {
      MicroKernel<MR, NV>(d, kdim, ar, a_rs, a_cs, b + v * N, ldb, cr + v * N, ldc, accumulate, rs);
    }
    for (; v < nvec; ++v) {
      MicroKernel<MR, 1>(d, kdim, ar, a_rs, a_cs, b + v * N, ldb, cr + v * N, ldc, accumulate, rs);
    }
  }
}

// The same for any number of rows (tails of 2 and 1 rows): for products with few rows, such
// as decode's query rows against a V tile read straight from the cache (no accumulate
// row_scale there). cols % Lanes == 0; B's rows must hold cols readable floats.
HWY_INLINE void GemmAnyRows(size_t rows, size_t cols, size_t kdim, const float* a, size_t a_rs,
                            size_t a_cs, const float* b, size_t ldb, float* c, size_t ldc,
                            bool accumulate) {
  const DF d;
  const size_t N = hn::Lanes(d);
  constexpr int NV = Micro::kNV;
  const size_t nvec = cols / N;
  size_t r = 0;
  auto block = [&]<int MR>(size_t r0) {
    size_t v = 0;
    for (; v + NV <= nvec; v += NV) {
      MicroKernel<MR, NV>(d, kdim, a + r0 * a_rs, a_rs, a_cs, b + v * N, ldb, c + r0 * ldc + v * N,
                          ldc, accumulate, nullptr);
    }
    for (; v < nvec; ++v) {
      MicroKernel<MR, 1>(d, kdim, a + r0 * a_rs, a_rs, a_cs, b + v * N, ldb, c + r0 * ldc + v * N,
                         ldc, accumulate, nullptr);
    }
  };
  for (; r + 4 <= rows; r += 4) block.template operator()<4>(r);
  for (; r + 2 <= rows; r += 2) block.template operator()<2>(r);
  for (; r < rows; ++r) block.template operator()<1>(r);
}

// The two passes of an online softmax over one row of raw scores s[0, n) (n % Lanes == 0), the
// first `visible` of which count, in log2 units (x = c * s, c = scale * log2(e)).
// ScaleMaskRow: s becomes x (-inf where masked); returns the lanes' running max.
HWY_INLINE VF ScaleMaskRow(float* HWY_RESTRICT s, size_t n, size_t visible, VF vc) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF ninf = hn::Set(d, kNegInf);
  VF vmax = ninf;
  for (size_t j = 0; j < n; j += N) {
    VF x = hn::Mul(hn::LoadU(d, s + j), vc);
    if (j + N > visible) x = hn::IfThenElse(hn::FirstN(d, visible > j ? visible - j : 0), x, ninf);
    hn::StoreU(x, d, s + j);
    vmax = hn::Max(vmax, x);
  }
  return vmax;
}
// ExpRow: s becomes p = 2^(x - mu); returns the lanes' sums of p.
HWY_INLINE VF ExpRow(float* HWY_RESTRICT s, size_t n, float mu) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF vm = hn::Set(d, mu);
  VF vsum = hn::Zero(d);
  for (size_t j = 0; j < n; j += N) {
    const VF p = Exp2(d, hn::Sub(hn::LoadU(d, s + j), vm));
    vsum = hn::Add(vsum, p);
    hn::StoreU(p, d, s + j);
  }
  return vsum;
}

// Online softmax over one row of raw scores s[0, n) (n % Lanes == 0), the first `visible`
// of which count. In log2 units: x = c * s with c = scale * log2(e). m is the running max
// and l the running sum of 2^(x - m); on return s holds p = 2^(x - m_new) (0 where masked),
// m and l are updated, and the factor 2^(m_old - m_new) that rescales the row's accumulator
// is returned. m is the max of every x seen, so each p <= 1 and l cannot overflow.
HWY_INLINE float OnlineSoftmaxRow(float* HWY_RESTRICT s, size_t n, size_t visible, float c,
                                  float& m, float& l) {
  const DF d;
  const VF vmax = ScaleMaskRow(s, n, visible, hn::Set(d, c));
  const float m_new = std::max(m, hn::GetLane(hn::MaxOfLanes(d, vmax)));
  // A row that has seen no key yet (m_new = -inf) keeps l = 0 and p = 0; subtracting 0
  // instead of -inf avoids -inf - -inf.
  const float mu = m_new == kNegInf ? 0.0f : m_new;
  const VF vsum = ExpRow(s, n, mu);
  const float alpha = std::exp2(m - mu);  // m = -inf gives 0: the accumulator was empty
  l = l * alpha + hn::GetLane(hn::SumOfLanes(d, vsum));
  m = m_new;
  return alpha;
}

// p = 2^(c * s - L) over one row (L: the row's log-sum-exp in log2 units, from a finished
// first pass or a forward), 0 beyond `visible`. Used by the backward and clamp's second pass.
HWY_INLINE void NormalisedRow(float* HWY_RESTRICT s, size_t n, size_t visible, float c,
                              float L) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF vc = hn::Set(d, c), vL = hn::Set(d, L);
  for (size_t j = 0; j < n; j += N) {
    VF p = Exp2(d, hn::MulSub(hn::LoadU(d, s + j), vc, vL));
    if (j + N > visible) p = hn::IfThenElseZero(hn::FirstN(d, visible > j ? visible - j : 0), p);
    hn::StoreU(p, d, s + j);
  }
}

// sum_d x[d] y[d] over n floats (any n).
HWY_INLINE float Dot(const float* HWY_RESTRICT x, const float* HWY_RESTRICT y, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    a0 = hn::MulAdd(hn::LoadU(d, x + i), hn::LoadU(d, y + i), a0);
    a1 = hn::MulAdd(hn::LoadU(d, x + i + N), hn::LoadU(d, y + i + N), a1);
  }
  for (; i + N <= n; i += N) a0 = hn::MulAdd(hn::LoadU(d, x + i), hn::LoadU(d, y + i), a0);
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

// The lane reductions of kN = MaxLanes vectors in one vector: lane j of the result is op over
// t[j]'s lanes (t is overwritten). A tree of ConcatEven/ConcatOdd pairs: level by level, vector
// j takes the pair results of vectors 2j (low half) and 2j + 1 (high half), so kN - 1 ops of
// whole vectors instead of a horizontal reduction per vector. Each lane's order of operations
// depends only on its own vector, not on its position. Fixed-width targets only.
template <class D, size_t kN, class Op>
HWY_INLINE hn::Vec<D> ReduceEach(D d, hn::Vec<D> (&t)[kN], Op op) {
  static_assert(kN == hn::MaxLanes(D()));
#if HWY_TARGET == HWY_SCALAR
  (void)d, (void)op;
  return t[0];
#else
#pragma GCC unroll 16
  for (size_t w = kN; w > 1; w /= 2) {
#pragma GCC unroll 16
    for (size_t j = 0; j < w / 2; ++j) {
      t[j] = op(hn::ConcatEven(d, t[2 * j + 1], t[2 * j]), hn::ConcatOdd(d, t[2 * j + 1], t[2 * j]));
    }
  }
  return t[0];
#endif
}

// Lane j: the sum of t[j]'s lanes.
template <class D, size_t kN>
HWY_INLINE hn::Vec<D> SumsOfLanes(D d, hn::Vec<D> (&t)[kN]) {
  return ReduceEach(d, t, [](hn::Vec<D> a, hn::Vec<D> b) { return hn::Add(a, b); });
}

// Online softmax of a tile's rows [0, rows) together: row i holds n raw scores at s + i * n
// (n % Lanes == 0), of which the first visible(i) count. Each row as OnlineSoftmaxRow, except
// that the maxima, sums, m, l and rescale factors of Lanes rows are formed as vectors: one
// Exp2 for the factors of Lanes rows and the reductions by ReduceEach, instead of two
// horizontal reductions and a scalar exp2 per row. alpha[i]: row i's factor 2^(m_old - m_new).
template <class Visible>
HWY_INLINE void OnlineSoftmaxRows(float* HWY_RESTRICT s, size_t n, size_t rows,
                                  const Visible& visible, float c, float* HWY_RESTRICT m,
                                  float* HWY_RESTRICT l, float* HWY_RESTRICT alpha) {
  const DF d;
  constexpr size_t kN = hn::MaxLanes(DF());
  const VF vc = hn::Set(d, c), ninf = hn::Set(d, kNegInf);
  for (size_t i0 = 0; i0 < rows; i0 += kN) {
    const size_t nr = std::min(kN, rows - i0);
    VF t[kN];
    for (size_t i = 0; i < kN; ++i) {
      t[i] = i < nr ? ScaleMaskRow(s + (i0 + i) * n, n, visible(i0 + i), vc) : ninf;
    }
    // m, l of the block's rows through aligned copies (lanes past nr: m = -inf, l = 0).
    HWY_ALIGN float mb[kN], lb[kN], ab[kN], mus[kN];
    for (size_t i = 0; i < kN; ++i) mb[i] = i < nr ? m[i0 + i] : kNegInf, lb[i] = i < nr ? l[i0 + i] : 0.0f;
    const VF m_old = hn::Load(d, mb);
    const VF m_new = hn::Max(m_old, ReduceEach(d, t, [](VF a, VF b) { return hn::Max(a, b); }));
    // A row that has seen no key yet (m_new = -inf) keeps l = 0 and p = 0; subtracting 0
    // instead of -inf avoids -inf - -inf. m_old = -inf gives a factor 0 (an empty accumulator).
    const VF mu = hn::IfThenElse(hn::Eq(m_new, ninf), hn::Zero(d), m_new);
    const VF a = Exp2(d, hn::Sub(m_old, mu));
    hn::Store(mu, d, mus);
    for (size_t i = 0; i < kN; ++i) t[i] = i < nr ? ExpRow(s + (i0 + i) * n, n, mus[i]) : hn::Zero(d);
    hn::Store(hn::MulAdd(hn::Load(d, lb), a, SumsOfLanes(d, t)), d, lb);
    hn::Store(m_new, d, mb);
    hn::Store(a, d, ab);
    for (size_t i = 0; i < nr; ++i) m[i0 + i] = mb[i], l[i0 + i] = lb[i], alpha[i0 + i] = ab[i];
  }
}

// Whether every x[0, n) is finite: x * 0 is NaN exactly for NaN and Inf (n % Lanes == 0).
HWY_INLINE bool AllFinite(const float* HWY_RESTRICT x, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF zero = hn::Zero(d);
  VF acc = zero;
  for (size_t i = 0; i < n; i += N) acc = hn::MulAdd(hn::LoadU(d, x + i), zero, acc);
  return hn::GetLane(hn::SumOfLanes(d, acc)) == 0.0f;
}

// y[0, n) += x[0, n), n % Lanes == 0.
HWY_INLINE void AddTo(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  for (size_t i = 0; i < n; i += N) hn::StoreU(hn::Add(hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
}

// y[0, n) += a * x[0, n), n % Lanes == 0.
HWY_INLINE void Axpy(float a, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF va = hn::Set(d, a);
  for (size_t i = 0; i < n; i += N) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  }
}

}  // namespace diffattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // DIFFATTN_SIMD_INL_H_
