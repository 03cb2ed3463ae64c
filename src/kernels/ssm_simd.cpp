// Mamba-1's selective scan and causal conv1d + SiLU (kernels/ssm.h) in Highway SIMD, compiled
// for each target like the fused attention kernels and chosen at run time. The scan works on
// h's own (E, N) layout, vectors over n: one channel's row of h and A at a time, its y the lane
// sum, formed for Lanes channels together (SumsOfLanes); the conv vectors over channels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/ssm_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/simd-inl.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "diffattn/kernels/runtime.h"
#include "diffattn/kernels/ssm.h"
#include "kernels/fused_traits.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::kernels::HWY_NAMESPACE {

namespace {

// Blocking and threading of both kernels, in one table.
struct SsmTiles {
  // Channels a thread runs through all of a call's tokens before the next ones: their h and A
  // rows (64 x N = 16 floats, 4 KiB each) stay in L1 from token to token.
  static constexpr int64_t kScanChannels = 64;
  // State updates (T * E * N) per thread, at least: a region costs a wake-up and a barrier
  // (microseconds when idle threads spin, far more when they sleep). A one-token decode at the
  // published shape (E = 5120, N = 16: 82K updates) takes 70-100 us on one AVX2 core of the
  // (shared) development VM, so it splits over two threads while they spin, not when they
  // sleep; a call a tenth its size stays on one.
  static constexpr double kMinUpdatesPerThread = 32 << 10;
  static constexpr double kMinUpdatesPerSleepingThread = 256 << 10;
  // Conv outputs (T * E) per thread, at least: K FMAs and a SiLU each, so far cheaper than a
  // state update; one decode token (E = 5120) stays on one thread.
  static constexpr double kMinConvPerThread = 64 << 10;
  static constexpr double kMinConvPerSleepingThread = 512 << 10;
  static_assert(kScanChannels % 16 == 0);  // whole vectors of channels on every target
};

int threads_for(double work, double per_thread, double per_sleeping_thread, int64_t max_items) {
  const int n = fused::Parallel::threads_for(
      work, idle_threads_sleep() ? per_sleeping_thread : per_thread, num_threads());
  return static_cast<int>(std::min<int64_t>(n, std::max<int64_t>(max_items, 1)));
}

// n <= Lanes floats at p as a vector, zeros past n (no read past n).
HWY_INLINE VF LoadPart(DF d, const float* HWY_RESTRICT p, size_t n) {
  if (n == hn::Lanes(d)) return hn::LoadU(d, p);
  HWY_ALIGN float buf[hn::MaxLanes(DF())] = {};
  std::memcpy(buf, p, n * sizeof(float));
  return hn::Load(d, buf);
}
// The first n <= Lanes lanes of v to p (no write past n).
HWY_INLINE void StorePart(DF d, VF v, float* HWY_RESTRICT p, size_t n) {
  if (n == hn::Lanes(d)) return hn::StoreU(v, d, p);
  HWY_ALIGN float buf[hn::MaxLanes(DF())];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, n * sizeof(float));
}

// silu(x) = x / (1 + exp(-x)). Highway's Exp (1 ulp) rather than Exp2 of x log2(e), whose
// rounded product costs |x| ulps: this runs once per (t, e), N times less often than the
// state update's Exp2.
HWY_INLINE VF Silu(DF d, VF x) {
  return hn::Div(x, hn::Add(hn::Set(d, 1.0f), hn::Exp(d, hn::Neg(x))));
}

// mamba_ssm's softplus: x for x > 20, log1p(exp(x)) otherwise, as max(x, 0) + log1p(exp(-|x|))
// (exp(-|x|) is in (0, 1]: no overflow for large x, and log1p keeps small ones exact).
HWY_INLINE VF Softplus(DF d, VF x) {
  const VF sp = hn::Add(hn::Max(x, hn::Zero(d)), hn::Log1p(d, hn::Exp(d, hn::Neg(hn::Abs(x)))));
  return hn::IfThenElse(hn::Gt(x, hn::Set(d, 20.0f)), x, sp);  // NaN: sp, NaN
}

// ---------------------------------------------------------------------------------------------
// Selective scan

// Channels [e0, e1) of p over all its tokens, a block of kScanChannels at a time. Each token of
// a block runs in three passes over its channels: dt (vectors over e), the state update (vectors
// over n, one channel's h row at a time, its y the lane sum; the sums of Lanes channels formed
// together by SumsOfLanes), then y's epilogue (vectors over e). The passes over e give the
// out-of-order core independent softplus and SiLU chains side by side: 0.70-0.89x the time of
// one pass per Lanes channels (E = 5120, N = 16, T = 1, AVX2, six alternating runs on the
// development VM). kNV: vectors of n per channel when N is a
// whole number of them (N = kNV Lanes: the rows of B and C stay in registers); 0: any N, the
// whole vectors first and the rest of a row lane by lane.
template <int kNV>
void ScanRange(const ScanParams& p, int64_t e0, int64_t e1) {
  const DF d;
  constexpr size_t L = hn::MaxLanes(DF());
  constexpr int64_t Eb = SsmTiles::kScanChannels, Li = static_cast<int64_t>(L);
  const int64_t N = p.N;
  const size_t nv = kNV > 0 ? static_cast<size_t>(kNV) : static_cast<size_t>(N) / L;
  const int64_t n_tail = static_cast<int64_t>(nv * L);
  const VF log2e = hn::Set(d, kLog2e);
  // The block's dt log2(e), dt u and y before D u, by channel.
  HWY_ALIGN float dt2[Eb], dtu[Eb], ys[Eb];
  for (int64_t b0 = e0; b0 < e1; b0 += Eb) {
    const int64_t nb = std::min(e1 - b0, Eb);
    for (int64_t t = 0; t < p.T; ++t) {
      const float* HWY_RESTRICT B = p.Bm + t * p.b_stride;
      const float* HWY_RESTRICT C = p.Cm + t * p.c_stride;
      const float* HWY_RESTRICT u = p.u + t * p.u_stride + b0;
      const float* HWY_RESTRICT delta = p.delta + t * p.delta_stride + b0;
      for (int64_t g = 0; g < nb; g += Li) {
        const size_t nr = static_cast<size_t>(std::min(Li, nb - g));
        const VF dt = Softplus(d, hn::Add(LoadPart(d, delta + g, nr),
                                          LoadPart(d, p.delta_bias + b0 + g, nr)));
        hn::Store(hn::Mul(dt, log2e), d, dt2 + g);
        hn::Store(hn::Mul(dt, LoadPart(d, u + g, nr)), d, dtu + g);
      }
      VF Bv[kNV > 0 ? kNV : 1], Cv[kNV > 0 ? kNV : 1];
      for (int v = 0; v < kNV; ++v) {
        Bv[v] = hn::LoadU(d, B + v * L), Cv[v] = hn::LoadU(d, C + v * L);
      }
      for (int64_t g = 0; g < nb; g += Li) {
        const size_t nr = static_cast<size_t>(std::min(Li, nb - g));
        // Lane sums of acc[i]: channel g + i's y before D u. Channels past nr sum zeros.
        VF acc[L];
#pragma GCC unroll 16
        for (size_t i = 0; i < L; ++i) {
          acc[i] = hn::Zero(d);
          if (i >= nr) continue;
          const int64_t c = g + static_cast<int64_t>(i);
          float* HWY_RESTRICT h = p.h + (b0 + c) * N;
          const float* HWY_RESTRICT A = p.A + (b0 + c) * N;
          const VF s = hn::Set(d, dt2[c]), w = hn::Set(d, dtu[c]);
          // h = exp(dt A) h + (dt u) B: exp(dt A) = 2^(A (dt log2 e)); dt A <= 0 for A < 0,
          // where Exp2 is accurate to 1e-7 and exactly 0 below 2^-126.5.
          for (size_t v = 0; v < nv; ++v) {
            const VF Bn = kNV > 0 ? Bv[v] : hn::LoadU(d, B + v * L);
            const VF Cn = kNV > 0 ? Cv[v] : hn::LoadU(d, C + v * L);
            const VF dA = Exp2(d, hn::Mul(hn::LoadU(d, A + v * L), s));
            const VF hv = hn::MulAdd(dA, hn::LoadU(d, h + v * L), hn::Mul(w, Bn));
            hn::StoreU(hv, d, h + v * L);
            acc[i] = hn::MulAdd(hv, Cn, acc[i]);
          }
          if constexpr (kNV == 0) {  // the rest of the row, lane by lane (N % Lanes != 0)
            float rest = 0.0f;
            for (int64_t n = n_tail; n < N; ++n) {
              h[n] = std::exp2(A[n] * dt2[c]) * h[n] + dtu[c] * B[n];
              rest += h[n] * C[n];
            }
            acc[i] = hn::Add(acc[i], hn::IfThenElseZero(hn::FirstN(d, 1), hn::Set(d, rest)));
          }
        }
        hn::Store(SumsOfLanes(d, acc), d, ys + g);
      }
      for (int64_t g = 0; g < nb; g += Li) {
        const size_t nr = static_cast<size_t>(std::min(Li, nb - g));
        const int64_t e = b0 + g;
        VF yv = hn::MulAdd(LoadPart(d, p.D + e, nr), LoadPart(d, u + g, nr), hn::Load(d, ys + g));
        if (p.y_pre) StorePart(d, yv, p.y_pre + t * p.y_pre_stride + e, nr);
        if (p.z) yv = hn::Mul(yv, Silu(d, LoadPart(d, p.z + t * p.z_stride + e, nr)));
        StorePart(d, yv, p.y + t * p.y_stride + e, nr);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Causal conv1d + SiLU

// Channels [e0, e1) of p: every token's output, then the new state of those channels.
void ConvRange(const ConvParams& p, int64_t e0, int64_t e1) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t T = p.T, E = p.E, K = p.K, S = K - 1;
  // xin[s]: new row s for s >= 0, state row S + s before it
  const auto row = [&](int64_t s) -> const float* {
    return s >= 0 ? p.x + s * p.x_stride : p.state + (S + s) * E;
  };
  const float* taps[16];
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) taps[k] = row(t - S + k);
    float* HWY_RESTRICT o = p.out + t * p.out_stride;
    for (int64_t e = e0; e < e1; e += L) {
      const size_t nr = static_cast<size_t>(std::min(L, e1 - e));
      VF acc = LoadPart(d, p.bias + e, nr);
      for (int64_t k = 0; k < K; ++k) {
        acc = hn::MulAdd(LoadPart(d, p.w + k * E + e, nr), LoadPart(d, taps[k] + e, nr), acc);
      }
      StorePart(d, Silu(d, acc), o + e, nr);
    }
  }
  // New row r is input T - S + r: an old state row S + (T - S + r) = T + r > r when T < S, so
  // ascending r reads each old row before it is overwritten.
  for (int64_t r = 0; r < S; ++r) {
    std::memcpy(p.state + r * E + e0, row(T - S + r) + e0,
                static_cast<size_t>(e1 - e0) * sizeof(float));
  }
}

}  // namespace

void SelectiveScan(const ScanParams& p) {
  constexpr int64_t L = static_cast<int64_t>(hn::MaxLanes(DF()));
  const int64_t blocks = (p.E + SsmTiles::kScanChannels - 1) / SsmTiles::kScanChannels;
  const int threads = threads_for(static_cast<double>(p.T) * static_cast<double>(p.E * p.N),
                                  SsmTiles::kMinUpdatesPerThread,
                                  SsmTiles::kMinUpdatesPerSleepingThread, blocks);
  // Channels are independent and each one's arithmetic is the same wherever its block falls:
  // any thread count gives the same bits.
  const auto run = [&]<int kNV>() {
    if (threads == 1) return ScanRange<kNV>(p, 0, p.E);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; ++b) {
      ScanRange<kNV>(p, b * SsmTiles::kScanChannels,
                     std::min(p.E, (b + 1) * SsmTiles::kScanChannels));
    }
  };
  switch (p.N % L == 0 ? p.N / L : 0) {
    case 1: return run.template operator()<1>();
    case 2: return run.template operator()<2>();
    case 4: return run.template operator()<4>();
    default: return run.template operator()<0>();
  }
}

void CausalConv1dSilu(const ConvParams& p) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t groups = (p.E + L - 1) / L;
  const int threads = threads_for(static_cast<double>(p.T) * static_cast<double>(p.E),
                                  SsmTiles::kMinConvPerThread, SsmTiles::kMinConvPerSleepingThread,
                                  groups);
  if (threads == 1) return ConvRange(p, 0, p.E);
  // Contiguous channel ranges of whole vectors, one per thread.
#pragma omp parallel num_threads(threads)
  {
    const int64_t n = omp_get_num_threads(), i = omp_get_thread_num();
    ConvRange(p, std::min(p.E, groups * i / n * L), std::min(p.E, groups * (i + 1) / n * L));
  }
}

}  // namespace diffattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace diffattn::kernels {

HWY_EXPORT(SelectiveScan);
HWY_EXPORT(CausalConv1dSilu);

void selective_scan_fused(const ScanParams& p) { HWY_DYNAMIC_DISPATCH(SelectiveScan)(p); }
void causal_conv1d_silu_fused(const ConvParams& p) { HWY_DYNAMIC_DISPATCH(CausalConv1dSilu)(p); }

}  // namespace diffattn::kernels
#endif
