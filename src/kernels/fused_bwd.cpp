// The fused backward, FlashAttention-2 style (arXiv:2307.08691, Algorithm 2): parallel over
// K/V blocks, so each item owns its rows of dK and dV; P is recomputed from q, k and the
// forward's saved log-sum-exp, never stored whole. dQ gathers contributions from every key
// block, so each thread accumulates its own dQ partial (static schedule: the same items in the
// same order every run) and the partials are summed in thread order at the end: the result is
// identical run to run for a fixed thread count.
//
//   out_i  = sum_j (P1_ij + c_i P2_ij) v_j,  c_i = -lam_i          (arXiv:2410.05258 Eq. 1)
//   dP_ij  = dout_i . v_j                   shared by both maps of a pair
//   D1_i   = dout_i . (out_i + lam_i o2_i)  = sum_j P1_ij dP_ij      (map 1's output)
//   D2_i   = dout_i . o2_i                  = sum_j P2_ij dP_ij
//   dS1_ij = P1_ij (dP_ij - D1_i),  dS2_ij = c_i P2_ij (dP_ij - D2_i)
//   dv_j  += (P1_ij + c_i P2_ij) dout_i,  dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i
//   dlam_i = -D2_i
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fused_bwd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd-inl.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "diffattn/kernels/runtime.h"
#include "kernels/fused.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::kernels::HWY_NAMESPACE {

namespace {

using fused::BwdTiles;
using fused::kColPad;
using fused::kRowPad;
using fused::round_up;

struct BwdLayout {
  int64_t gs, nkh, qheads, Dp, Dvp, nkb, Tq_pad;
  float c;
  explicit BwdLayout(const AttnProblem& p) {
    gs = p.group_size();
    nkh = (p.maps == 2 && !p.shared_keys) ? 2 : 1;
    qheads = p.q_heads();
    Dp = round_up(p.D, kColPad);
    Dvp = round_up(p.Dv, kColPad);
    nkb = (p.Tk + BwdTiles::kBk - 1) / BwdTiles::kBk;
    Tq_pad = p.Tq + kRowPad;  // a query block starting anywhere may pad past Tq
    c = p.scale * kLog2e;
  }
};

struct BwdScratch {
  fused::Buffer kt, kp, vt, dk, dv, dkh, dvh, q, dO, dP, s, w;
  BwdScratch(const AttnProblem& p, const BwdLayout& f) {
    const int64_t Bk = BwdTiles::kBk, Bq = BwdTiles::kBq;
    kt = fused::alloc(f.nkh * p.D * Bk);   // (nkh, D, Bk) keys transposed
    kp = fused::alloc(f.nkh * Bk * f.Dp);  // (nkh, Bk, Dp) keys
    vt = fused::alloc(p.Dv * Bk);          // (Dv, Bk) values transposed
    dk = fused::alloc(f.nkh * Bk * f.Dp);  // (nkh, Bk, Dp) dK of the block
    dv = fused::alloc(Bk * f.Dvp);         // (Bk, Dvp) dV of the block
    dkh = fused::alloc(f.nkh * Bk * f.Dp);  // (nkh, Bk, Dp) one pair's share of dK
    dvh = fused::alloc(Bk * f.Dvp);         // (Bk, Dvp) one pair's share of dV
    q = fused::alloc(Bq * f.Dp);           // (Bq, Dp) one map's queries
    dO = fused::alloc(Bq * f.Dvp);         // (Bq, Dvp) dout of one pair
    dP = fused::alloc(Bq * Bk);            // (Bq, Bk) dout V^T
    s = fused::alloc(Bq * Bk);             // (Bq, Bk) scores, P, then dS
    w = fused::alloc(Bq * Bk);             // (Bq, Bk) P1 + c P2, the weights of dv
  }
};

// Per-row inputs of the backward, (B, maps*H, Tq): D_i, and lse in log2 units as a float
// lse2 and a factor rfac = 2^(lse2 - lse log2(e)) that is 1 within float rounding: the row's
// probabilities are 2^(c s - lse2) rfac. A float lse2 alone would scale a whole row of P by up
// to half an ulp of lse2 (3e-7 at lse2 ~ 8), an error common to every term of the row's dQ.
struct RowStats {
  std::vector<float> delta, lse2, rfac;
};

// One key block of one (batch, group): dK, dV of its rows and its share of dQ.
void BwdItem(const AttnBwdParams& p, const BwdLayout& f, const RowStats& st, BwdScratch& w,
             float* dq_part, int64_t b, int64_t g, int64_t kb) {
  const Rows r(p);
  const int64_t Bk = BwdTiles::kBk, Bq = BwdTiles::kBq;
  const int64_t j0 = kb * Bk, nk = std::min(Bk, p.Tk - j0);
  for (int64_t kl = 0; kl < f.nkh; ++kl) {
    const int64_t kh = f.nkh == 2 ? 2 * g + kl : g;
    fused::pack_transposed(w.kt.get() + kl * p.D * Bk, Bk, r.k(b, j0, kh), p.k_row_stride, nk,
                           p.D);
    fused::pack_rows(w.kp.get() + kl * Bk * f.Dp, f.Dp, Bk, r.k(b, j0, kh), p.k_row_stride, nk,
                     p.D);
  }
  fused::pack_transposed(w.vt.get(), Bk, r.v(b, j0, g), p.v_row_stride, nk, p.Dv);
  std::fill(w.dk.get(), w.dk.get() + f.nkh * Bk * f.Dp, 0.0f);
  std::fill(w.dv.get(), w.dv.get() + Bk * f.Dvp, 0.0f);

  const DF d;
  const size_t N = hn::Lanes(d);
  // The first query row that sees key j0 (bottom-right causal: j <= i + Tk - Tq).
  const int64_t qstart = p.causal ? std::max<int64_t>(0, j0 - (p.Tk - p.Tq)) : 0;
  // dK and dV sum over every query row of every pair of the group: gs * Tq terms. Each pair's
  // share is summed in its own buffer (dkh, dvh: Tq / Bq partials of Bq terms, MicroKernel),
  // then added to the block's total, so no float32 chain is longer than Bq + Tq / Bq + gs
  // (FlashAttention's accuracy rule, tests/python/test_precision.py).
  for (int64_t hh = 0; hh < f.gs && qstart < p.Tq; ++hh) {
    const int64_t h = g * f.gs + hh;
    for (int64_t i0 = qstart; i0 < p.Tq; i0 += Bq) {
      const bool fresh = i0 == qstart;  // the pair's first block starts its partials from 0
      const int64_t nq = std::min(Bq, p.Tq - i0), nqp = round_up(nq, kRowPad);
      fused::pack_rows(w.dO.get(), f.Dvp, nqp, r.dout(b, i0, h), p.o_row_stride, nq, p.Dv);
      // dP (nqp, Bk) = dout V^T
      Gemm(nqp, Bk, p.Dv, w.dO.get(), f.Dvp, 1, w.vt.get(), Bk, w.dP.get(), Bk, false);
      for (int m = 0; m < p.maps; ++m) {
        const int64_t qh = r.q_head(h, m), kl = f.nkh == 2 ? m : 0;
        fused::pack_rows(w.q.get(), f.Dp, nqp, r.q(b, i0, qh), p.q_row_stride, nq, p.D);
        Gemm(nqp, Bk, p.D, w.q.get(), f.Dp, 1, w.kt.get() + kl * p.D * Bk, Bk, w.s.get(), Bk,
             false);
        const int64_t stat = (b * f.qheads + qh) * p.Tq + i0;
        for (int64_t t = 0; t < nqp; ++t) {
          float* srow = w.s.get() + t * Bk;
          float* wrow = w.w.get() + t * Bk;
          const float* dprow = w.dP.get() + t * Bk;
          const bool real = t < nq;
          const int64_t vis = real ? fused::visible_in_tile(p, i0 + t, j0, nk) : 0;
          NormalisedRow(srow, Bk, vis, f.c, real ? st.lse2[stat + t] : 0.0f);
          const float cl = (p.maps == 2 && real) ? -r.lam(b, i0 + t, h) : 0.0f;
          const float coef = (m == 0 ? 1.0f : cl) * p.scale;
          const VF vr = hn::Set(d, real ? st.rfac[stat + t] : 1.0f);
          const VF vdelta = hn::Set(d, real ? st.delta[stat + t] : 0.0f);
          const VF vcoef = hn::Set(d, coef), vcl = hn::Set(d, cl);
          for (int64_t j = 0; j < Bk; j += N) {
            const VF P = hn::Mul(hn::LoadU(d, srow + j), vr);
            // the weights of dv: P1 (map 1, or standard), then + c P2
            if (m == 0) {
              hn::StoreU(P, d, wrow + j);
            } else {
              hn::StoreU(hn::MulAdd(vcl, P, hn::LoadU(d, wrow + j)), d, wrow + j);
            }
            // dS scaled: coef * P * (dP - D)
            const VF ds = hn::Mul(hn::Mul(P, vcoef), hn::Sub(hn::LoadU(d, dprow + j), vdelta));
            hn::StoreU(ds, d, srow + j);
          }
        }
        // dK (Bk, Dp) += dS^T Q;  dQ (nqp, Dp) += dS K  (into this thread's partial)
        Gemm(Bk, f.Dp, nqp, w.s.get(), 1, Bk, w.q.get(), f.Dp, w.dkh.get() + kl * Bk * f.Dp,
             f.Dp, !(fresh && (m == 0 || f.nkh == 2)));
        float* dqp = dq_part + ((b * f.Tq_pad + i0) * f.qheads + qh) * f.Dp;
        Gemm(nqp, f.Dp, nk, w.s.get(), Bk, 1, w.kp.get() + kl * Bk * f.Dp, f.Dp, dqp,
             f.qheads * f.Dp, true);
      }
      // dV (Bk, Dvp) += W^T dout
      Gemm(Bk, f.Dvp, nqp, w.w.get(), 1, Bk, w.dO.get(), f.Dvp, w.dvh.get(), f.Dvp, !fresh);
    }
    AddTo(w.dkh.get(), w.dk.get(), static_cast<size_t>(f.nkh * Bk * f.Dp));
    AddTo(w.dvh.get(), w.dv.get(), static_cast<size_t>(Bk * f.Dvp));
  }
  for (int64_t kl = 0; kl < f.nkh; ++kl) {
    const int64_t kh = f.nkh == 2 ? 2 * g + kl : g;
    float* dk = p.dk + (r.k(b, j0, kh) - p.kf());
    for (int64_t j = 0; j < nk; ++j) {
      std::copy_n(w.dk.get() + (kl * Bk + j) * f.Dp, p.D, dk + j * p.k_row_stride);
    }
  }
  float* dv = p.dv + (r.v(b, j0, g) - p.vf());
  for (int64_t j = 0; j < nk; ++j) std::copy_n(w.dv.get() + j * f.Dvp, p.Dv, dv + j * p.v_row_stride);
}

}  // namespace

void FusedBackward(const AttnBwdParams& p) {
  if (p.B == 0) return;
  const Rows r(p);
  const BwdLayout f(p);
  const int threads = fused::Parallel::threads_for(
      2.5 * attention_fwd_flops(p), fused::Parallel::kMinFlopsPerThread, num_threads());
  const int64_t H = p.H, Tq = p.Tq;

  // Row statistics: D_i per map and the saved lse in log2 units; dlam = -D2.
  RowStats st;
  st.delta.resize(static_cast<size_t>(p.B * f.qheads * Tq));
  st.lse2.resize(st.delta.size());
  st.rfac.resize(st.delta.size());
  std::vector<double> dl2(p.maps == 2 && !p.lam_per_token ? static_cast<size_t>(p.B * H * Tq) : 0);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bi = 0; bi < p.B * Tq; ++bi) {
    const int64_t b = bi / Tq, i = bi % Tq;
    for (int64_t h = 0; h < H; ++h) {
      const float* dout = r.dout(b, i, h);
      const float* out = r.saved_out(b, i, h);
      double d1 = 0;
      for (int64_t d = 0; d < p.Dv; ++d) d1 += static_cast<double>(dout[d]) * out[d];
      if (p.maps == 2) {
        const float* o2 = p.o2 + r.o2_index(b, i, h);
        double d2 = 0;
        for (int64_t d = 0; d < p.Dv; ++d) d2 += static_cast<double>(dout[d]) * o2[d];
        d1 += r.lam(b, i, h) * d2;  // dout . (out + lam o2): map 1's output
        st.delta[r.lse_index(b, 2 * h + 1, i)] = static_cast<float>(d2);
        if (p.lam_per_token) {
          p.dlam[(b * Tq + i) * H + h] = static_cast<float>(-d2);
        } else {
          dl2[(b * H + h) * Tq + i] = d2;
        }
      }
      st.delta[r.lse_index(b, r.q_head(h, 0), i)] = static_cast<float>(d1);
      for (int m = 0; m < p.maps; ++m) {
        const int64_t idx = r.lse_index(b, r.q_head(h, m), i);
        const double L = p.lse[idx] * 1.44269504088896340736;
        st.lse2[idx] = static_cast<float>(L);
        st.rfac[idx] = std::isfinite(L) ? static_cast<float>(std::exp2(st.lse2[idx] - L)) : 1.0f;
      }
    }
  }
  if (p.maps == 2 && !p.lam_per_token) {
    // dlam per pair, or (a scalar lambda) one sum over every pair: in double, rounded once,
    // so pairs whose shares cancel lose nothing to a per-pair float rounding.
    double all = 0;
    for (int64_t h = 0; h < H; ++h) {
      double s = 0;
      for (int64_t b = 0; b < p.B; ++b) {
        for (int64_t i = 0; i < Tq; ++i) s -= dl2[(b * H + h) * Tq + i];
      }
      if (p.lam_scalar) all += s;
      else p.dlam[h] = static_cast<float>(s);
    }
    if (p.lam_scalar) p.dlam[0] = static_cast<float>(all);
  }

  // dK, dV per key block; dQ partials per thread.
  const int64_t items = p.B * p.G * f.nkb;
  const int64_t part_size = p.B * f.Tq_pad * f.qheads * f.Dp;
  std::vector<fused::Buffer> parts(static_cast<size_t>(threads));
  int team = 1;
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
#pragma omp single
    team = omp_get_num_threads();
    parts[tid] = fused::alloc(part_size);
    std::fill(parts[tid].get(), parts[tid].get() + part_size, 0.0f);
    BwdScratch scratch(p, f);
    // Static round-robin: item it always runs on thread it % team, in increasing order, so
    // each partial sums the same terms in the same order every run. Interleaving also
    // balances causal work (early key blocks are seen by more query rows).
#pragma omp for schedule(static, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t bg = it / f.nkb;
      BwdItem(p, f, st, scratch, parts[tid].get(), bg / p.G, bg % p.G, it % f.nkb);
    }
  }
  // dq = the sum of the partials (dS already carries the scale), in thread order.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bi = 0; bi < p.B * Tq; ++bi) {
    const int64_t b = bi / Tq, i = bi % Tq;
    for (int64_t qh = 0; qh < f.qheads; ++qh) {
      float* dq = p.dq + (r.q(b, i, qh) - p.q);
      const int64_t off = ((b * f.Tq_pad + i) * f.qheads + qh) * f.Dp;
      for (int64_t d = 0; d < p.D; ++d) {
        float s = 0;
        for (int t = 0; t < team; ++t) s += parts[t][off + d];
        dq[d] = s;
      }
    }
  }
}

}  // namespace diffattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace diffattn::kernels {

HWY_EXPORT(FusedBackward);

void attention_bwd_fused(const AttnBwdParams& p) { HWY_DYNAMIC_DISPATCH(FusedBackward)(p); }

}  // namespace diffattn::kernels
#endif
