// The fused forward of the operator family, FlashAttention-2 style (arXiv:2307.08691) with the
// differential fusion of arXiv:2410.05258: for a block of query rows of every pair of a
// key/value group and both maps, one pass over K/V tiles keeps two online-softmax states and
// two accumulators per row; each V tile is multiplied once by the stacked weights of both maps
// and all pairs of the group. Memory is O(rows x Dv) per thread, never Tq x Tk.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fused_fwd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd-inl.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "diffattn/kernels/runtime.h"
#include "kernels/fused.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::kernels::HWY_NAMESPACE {

namespace {

using fused::FwdTiles;
using fused::kColPad;
using fused::kRowPad;
using fused::round_up;

// How one call is cut into items (b, g, query block) and how an item stacks its rows: row set
// s = hh * maps + m holds map m of pair g * gs + hh for the block's Bq query rows. With shared
// noise maps (noise_share ns > 1, signed mode) the sets are the gs pairs' map-1 rows, then one
// map-2 set per ns pairs (read from the first pair's query rows): each shared map once.
struct FwdLayout {
  int64_t gs, ns, sets, Bq, nqb, nkh, Dvp, R, ntiles, tile_floats;
  float c;  // scale * log2(e): scores in log2 units, so exp is exp2

  // The pair (0..gs-1 inside the group) and map a row set reads, and the set of (pair, map).
  int64_t set_pair(int64_t s, int maps) const {
    return ns > 1 ? (s < gs ? s : (s - gs) * ns) : s / maps;
  }
  int set_map(int64_t s, int maps) const {
    return ns > 1 ? (s < gs ? 0 : 1) : static_cast<int>(s % maps);
  }
  int64_t set_of(int64_t hh, int m, int maps) const {
    return ns > 1 ? (m == 0 ? hh : gs + hh / ns) : hh * maps + m;
  }

  explicit FwdLayout(const AttnParams& p) {
    gs = p.group_size();
    ns = p.maps == 2 && p.mode == DiffMode::Signed ? p.noise_share : 1;
    sets = ns > 1 ? gs + gs / ns : gs * p.maps;
    Bq = std::clamp(FwdTiles::kRows / sets / kRowPad * kRowPad, kRowPad, FwdTiles::kMaxBq);
    Bq = std::min(Bq, round_up(std::max<int64_t>(p.Tq, 1), kRowPad));
    nqb = (p.Tq + Bq - 1) / Bq;
    nkh = (p.maps == 2 && !p.shared_keys) ? 2 : 1;
    Dvp = round_up(p.Dv, kColPad);
    R = sets * Bq;
    c = p.scale * kLog2e;
    ntiles = (p.Tk + FwdTiles::kBk - 1) / FwdTiles::kBk;
    tile_floats = nkh * p.D * FwdTiles::kBk + FwdTiles::kBk * Dvp;
  }
};

// Keys [j0, j0 + nk) of batch b, group g into dst (one tile), row by row from where they lie:
// pool rows through pages, 16-bit elements widened. row: max(D, Dv) floats of scratch.
void PackTileRows(const AttnParams& p, const FwdLayout& f, const fused::KvPages* pages, float* dst,
                  int64_t b, int64_t g, int64_t j0, int64_t nk, float* row) {
  const int64_t Bk = FwdTiles::kBk;
  float* const kdst = dst;
  float* const vdst = dst + f.nkh * p.D * Bk;
  const bool f32 = p.kv_dtype == DType::F32;
  for (int64_t t = 0; t < nk; ++t) {
    const int64_t j = j0 + t;
    const int64_t k_at =
        pages ? pages->row(j) * p.k_row_stride : b * p.k_batch_stride + j * p.k_row_stride;
    const int64_t v_at =
        pages ? pages->row(j) * p.v_row_stride : b * p.v_batch_stride + j * p.v_row_stride;
    for (int64_t kl = 0; kl < f.nkh; ++kl) {
      const int64_t kh = f.nkh == 2 ? 2 * g + kl : g;
      const int64_t at = k_at + kh * p.k_head_stride;
      const float* src = p.kf() + at;
      if (!f32) {
        convert_to_f32(row, p.kh() + at, p.kv_dtype, p.D);
        src = row;
      }
      float* kd = kdst + kl * p.D * Bk + t;
      for (int64_t d = 0; d < p.D; ++d) kd[d * Bk] = src[d];
    }
    const int64_t at = v_at + g * p.v_head_stride;
    float* vd = vdst + t * f.Dvp;
    if (f32) {
      std::memcpy(vd, p.vf() + at, sizeof(float) * static_cast<size_t>(p.Dv));
    } else {
      convert_to_f32(vd, p.vh() + at, p.kv_dtype, p.Dv);
    }
    std::fill(vd + p.Dv, vd + f.Dvp, 0.0f);
  }
  for (int64_t kl = 0; kl < f.nkh; ++kl) {
    for (int64_t d = 0; d < p.D; ++d) {
      float* kd = kdst + (kl * p.D + d) * Bk;
      std::fill(kd + nk, kd + Bk, 0.0f);
    }
  }
  std::fill(vdst + nk * f.Dvp, vdst + Bk * f.Dvp, 0.0f);
}

// The keys and values of every K/V tile, packed once per call (every query block of a group
// reads them): per (b, g, tile) the keys of each key head of the group transposed
// (nkh, D, Bk), then the values (Bk, Dvp), zero beyond Tk and Dv. O(Tk) memory, a copy of K
// and V; it saves re-transposing each key tile for every query block. The tiles are packed
// from where K and V lie: a contiguous float32 cache by rows at its strides, the blocks of a
// pool (pages) or a 16-bit cache row by row (PackTileRows), widened to float32 as they are
// read: no gathered or widened copy of the whole cache is made.
// Returns whether every packed value is finite when the call is causal with more than one query
// row (else true): the tile products multiply masked weights (0) by V, so a NaN or Inf value
// would poison rows that never see its key; the dispatcher then takes the reference. The check
// reads each packed tile while it is in cache, instead of another pass over v.
bool PackKV(const AttnParams& p, const FwdLayout& f, const fused::KvPages* pages, float* packed,
            int threads) {
  const Rows r(p);
  const int64_t Bk = FwdTiles::kBk, n = p.B * p.G * f.ntiles;
  const bool check = p.causal && p.Tq > 1;
  // Contiguous float32 K/V: whole rows at the cache's strides; else row by row (PackTileRows).
  const bool by_rows = pages != nullptr || p.kv_dtype != DType::F32;
  bool finite = true;
#pragma omp parallel num_threads(threads) reduction(&& : finite)
  {
    float* const row = by_rows ? fused::scratch(7, std::max(p.D, p.Dv)) : nullptr;
#pragma omp for schedule(static)
    for (int64_t x = 0; x < n; ++x) {
      const int64_t tile = x % f.ntiles, bg = x / f.ntiles, b = bg / p.G, g = bg % p.G;
      const int64_t j0 = tile * Bk, nk = std::min(Bk, p.Tk - j0);
      float* dst = packed + x * f.tile_floats;
      if (by_rows) {
        PackTileRows(p, f, pages, dst, b, g, j0, nk, row);
      } else {
        for (int64_t kl = 0; kl < f.nkh; ++kl) {
          const int64_t kh = f.nkh == 2 ? 2 * g + kl : g;
          fused::pack_transposed(dst + kl * p.D * Bk, Bk, r.k(b, j0, kh), p.k_row_stride, nk, p.D);
        }
        fused::pack_rows(dst + f.nkh * p.D * Bk, f.Dvp, Bk, r.v(b, j0, g), p.v_row_stride, nk, p.Dv);
      }
      if (check) finite = AllFinite(dst + f.nkh * p.D * Bk, static_cast<size_t>(Bk * f.Dvp)) && finite;
    }
  }
  return finite;
}

// Per-thread scratch of one item.
struct FwdScratch {
  fused::Buffer q, s, o, m, l, alpha, L, wsum;
  FwdScratch(const AttnParams& p, const FwdLayout& f) {
    const int64_t Bk = FwdTiles::kBk;
    q = fused::alloc(f.R * p.D);       // (R, D) the rows' queries
    s = fused::alloc(f.R * Bk);        // (R, Bk) scores, then weights
    o = fused::alloc(f.R * f.Dvp);     // (R, Dvp) accumulators
    m = fused::alloc(f.R);             // running max (log2 units)
    l = fused::alloc(f.R);             // running sum
    alpha = fused::alloc(f.R);         // rescale of this tile
    L = fused::alloc(f.R);             // clamp: log2-sum-exp after the first pass
    wsum = fused::alloc(f.R);          // clamp: sum of the clamped weights
  }
};

class FwdItem {
 public:
  FwdItem(const AttnParams& p, const FwdLayout& f, FwdScratch& w, const float* packed, int64_t b,
          int64_t g, int64_t i0)
      : p_(p), r_(p), f_(f), w_(w), packed_(packed + (b * p.G + g) * f.ntiles * f.tile_floats),
        b_(b), g_(g), i0_(i0), nq_(std::min(f.Bq, p.Tq - i0)) {}

  void run() {
    pack_queries();
    // Keys past the last one the block's final row sees are skipped (causal), whole tiles.
    kend_ = p_.causal ? std::clamp<int64_t>(p_.last_key(i0_ + nq_ - 1) + 1, 0, p_.Tk) : p_.Tk;
    std::fill(w_.m.get(), w_.m.get() + f_.R, kNegInf);
    std::fill(w_.l.get(), w_.l.get() + f_.R, 0.0f);
    if (p_.maps == 2 && p_.mode == DiffMode::Clamp) {
      clamp_passes();
    } else {
      signed_pass();
    }
  }

 private:
  int64_t Bk() const { return FwdTiles::kBk; }

  void pack_queries() {
    for (int64_t s = 0; s < f_.sets; ++s) {
      const int64_t h = g_ * f_.gs + f_.set_pair(s, p_.maps);
      const int m = f_.set_map(s, p_.maps);
      fused::pack_rows(w_.q.get() + s * f_.Bq * p_.D, p_.D, f_.Bq,
                       r_.q(b_, i0_, r_.q_head(h, m)), p_.q_row_stride, nq_, p_.D);
    }
  }

  // The packed tile starting at key j0: keys (nkh, D, Bk) transposed, then values (Bk, Dvp).
  const float* kt(int64_t j0) const { return packed_ + (j0 / Bk()) * f_.tile_floats; }
  const float* vt(int64_t j0) const { return kt(j0) + f_.nkh * p_.D * Bk(); }

  // S (R, Bk) = Q K^T for every row set against its map's keys.
  void scores(int64_t j0) {
    const float* kt0 = kt(j0);
    if (f_.nkh == 1) {  // shared keys or standard: one product over all stacked rows
      Gemm(f_.R, Bk(), p_.D, w_.q.get(), p_.D, 1, kt0, Bk(), w_.s.get(), Bk(), false);
      return;
    }
    // runs of consecutive sets on the same keys: one product each (shared noise maps: two)
    for (int64_t s = 0; s < f_.sets;) {
      const int kl = f_.set_map(s, p_.maps);
      int64_t e = s + 1;
      while (e < f_.sets && f_.set_map(e, p_.maps) == kl) ++e;
      Gemm((e - s) * f_.Bq, Bk(), p_.D, w_.q.get() + s * f_.Bq * p_.D, p_.D, 1,
           kt0 + kl * p_.D * Bk(), Bk(), w_.s.get() + s * f_.Bq * Bk(), Bk(), false);
      s = e;
    }
  }

  int64_t visible(int64_t row, int64_t j0, int64_t nk) const {
    const int64_t t = row % f_.Bq;
    return t < nq_ ? fused::visible_in_tile(p_, i0_ + t, j0, nk) : 0;
  }

  // Signed differential or standard attention: one pass of online softmax.
  void signed_pass() {
    bool first = true;
    for (int64_t j0 = 0; j0 < kend_; j0 += Bk()) {
      const int64_t nk = std::min(Bk(), p_.Tk - j0);
      scores(j0);
      for (int64_t row = 0; row < f_.R; ++row) {
        w_.alpha[row] = OnlineSoftmaxRow(w_.s.get() + row * Bk(), Bk(), visible(row, j0, nk),
                                         f_.c, w_.m[row], w_.l[row]);
      }
      // O = alpha O + P V: one product for both maps and every pair (V read once).
      Gemm(f_.R, f_.Dvp, nk, w_.s.get(), Bk(), 1, vt(j0), f_.Dvp, w_.o.get(), f_.Dvp, !first,
           w_.alpha.get());
      first = false;
    }
    for (int64_t hh = 0; hh < f_.gs; ++hh) {
      const int64_t h = g_ * f_.gs + hh;
      for (int64_t t = 0; t < nq_; ++t) {
        const int64_t i = i0_ + t;
        const int64_t r1 = f_.set_of(hh, 0, p_.maps) * f_.Bq + t;
        const float inv1 = w_.l[r1] == 0 ? 0.0f : 1.0f / w_.l[r1];  // NaN stays NaN
        const float* o1 = w_.o.get() + r1 * f_.Dvp;
        float* out = r_.out(b_, i, h);
        save_lse(h, 0, i, r1);
        if (p_.maps == 1) {
          for (int64_t d = 0; d < p_.Dv; ++d) out[d] = inv1 != 0 ? o1[d] * inv1 : 0.0f;
          continue;
        }
        const int64_t r2 = f_.set_of(hh, 1, p_.maps) * f_.Bq + t;
        const float inv2 = w_.l[r2] == 0 ? 0.0f : 1.0f / w_.l[r2];
        const float* o2 = w_.o.get() + r2 * f_.Dvp;
        save_lse(h, 1, i, r2);
        // out = A1 V - lam A2 V (arXiv:2410.05258 Eq. 1); a row that sees no key is 0.
        const float lam = r_.lam(b_, i, h);
        for (int64_t d = 0; d < p_.Dv; ++d) {
          const float a1v = inv1 != 0 ? o1[d] * inv1 : 0.0f;
          const float a2v = inv2 != 0 ? o2[d] * inv2 : 0.0f;
          out[d] = a1v - lam * a2v;
        }
        if (p_.o2) {
          float* dst = p_.o2 + r_.o2_index(b_, i, h);
          for (int64_t d = 0; d < p_.Dv; ++d) dst[d] = inv2 != 0 ? o2[d] * inv2 : 0.0f;
        }
      }
    }
  }

  // lse = ln(sum exp(scale q.k)) = (m + log2 l) ln 2; +inf for a row that sees no key.
  void save_lse(int64_t h, int m, int64_t i, int64_t row) const {
    if (!p_.lse) return;
    p_.lse[r_.lse_index(b_, r_.q_head(h, m), i)] = fused::lse_of(w_.m[row], w_.l[row]);
  }

  // Clamp mode (the textbook's variant): the weights max(A1 - lam A2, 0) need both maps
  // normalised, so a first pass finds each row's log-sum-exp and a second forms the weights.
  void clamp_passes() {
    for (int64_t j0 = 0; j0 < kend_; j0 += Bk()) {
      const int64_t nk = std::min(Bk(), p_.Tk - j0);
      scores(j0);
      for (int64_t row = 0; row < f_.R; ++row) {
        OnlineSoftmaxRow(w_.s.get() + row * Bk(), Bk(), visible(row, j0, nk), f_.c, w_.m[row],
                         w_.l[row]);
      }
    }
    for (int64_t row = 0; row < f_.R; ++row) {
      // l = 0: no key seen (+inf, p = 0); a NaN l (a NaN score) stays NaN and reaches out.
      w_.L[row] = w_.l[row] == 0 ? std::numeric_limits<float>::infinity()
                                 : w_.m[row] + std::log2(w_.l[row]);
      w_.wsum[row] = 0.0f;
    }
    bool first = true;
    for (int64_t j0 = 0; j0 < kend_; j0 += Bk()) {
      const int64_t nk = std::min(Bk(), p_.Tk - j0);
      scores(j0);
      for (int64_t row = 0; row < f_.R; ++row) {
        NormalisedRow(w_.s.get() + row * Bk(), Bk(), visible(row, j0, nk), f_.c, w_.L[row]);
      }
      for (int64_t hh = 0; hh < f_.gs; ++hh) {
        for (int64_t t = 0; t < nq_; ++t) {
          const int64_t r1 = 2 * hh * f_.Bq + t;
          float* w1 = w_.s.get() + r1 * Bk();
          const float* p2 = w1 + f_.Bq * Bk();
          const float lam = r_.lam(b_, i0_ + t, g_ * f_.gs + hh);
          float sum = 0;
          for (int64_t j = 0; j < nk; ++j) {
            w1[j] = std::max(w1[j] - lam * p2[j], 0.0f);
            sum += w1[j];
          }
          w_.wsum[r1] += sum;
        }
      }
      // Map-1 rows now hold the clamped weights, map-2 rows A2 (for o2).
      Gemm(f_.R, f_.Dvp, nk, w_.s.get(), Bk(), 1, vt(j0), f_.Dvp, w_.o.get(), f_.Dvp, !first);
      first = false;
    }
    for (int64_t hh = 0; hh < f_.gs; ++hh) {
      const int64_t h = g_ * f_.gs + hh;
      for (int64_t t = 0; t < nq_; ++t) {
        const int64_t i = i0_ + t, r1 = 2 * hh * f_.Bq + t, r2 = r1 + f_.Bq;
        save_lse(h, 0, i, r1);
        save_lse(h, 1, i, r2);
        // A row that clamps to all zeros stays zero rather than dividing by zero.
        const float inv = w_.wsum[r1] == 0 ? 0.0f : 1.0f / w_.wsum[r1];  // NaN stays NaN
        float* out = r_.out(b_, i, h);
        const float* o1 = w_.o.get() + r1 * f_.Dvp;
        for (int64_t d = 0; d < p_.Dv; ++d) out[d] = inv != 0 ? o1[d] * inv : 0.0f;
        if (p_.o2) {
          float* dst = p_.o2 + r_.o2_index(b_, i, h);
          const float* o2 = w_.o.get() + r2 * f_.Dvp;
          const bool any = w_.l[r2] != 0;  // NaN counts: it must show
          for (int64_t d = 0; d < p_.Dv; ++d) dst[d] = any ? o2[d] : 0.0f;
        }
      }
    }
  }

  const AttnParams& p_;
  const Rows r_;
  const FwdLayout& f_;
  FwdScratch& w_;
  const float* packed_;  // this (b, g)'s packed tiles
  const int64_t b_, g_, i0_, nq_;
  int64_t kend_ = 0;
};

}  // namespace

bool FusedForward(const AttnParams& p, const fused::KvPages* pages) {
  if (p.B == 0 || p.Tq == 0) return true;
  const FwdLayout f(p);
  const int64_t items = p.B * p.G * f.nqb;
  const int threads = static_cast<int>(std::min<int64_t>(
      fused::Parallel::threads_for(attention_fwd_flops(p), fused::Parallel::kMinFlopsPerThread,
                                   num_threads()),
      items));
  fused::Buffer packed = fused::alloc(p.B * p.G * f.ntiles * f.tile_floats);
  if (!PackKV(p, f, pages, packed.get(), threads)) return false;
#pragma omp parallel num_threads(threads)
  {
    FwdScratch scratch(p, f);
    // Later query blocks see more keys (causal): they go first, so the tail is short.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qb = f.nqb - 1 - it / (p.B * p.G);
      const int64_t bg = it % (p.B * p.G);
      FwdItem(p, f, scratch, packed.get(), bg / p.G, bg % p.G, qb * f.Bq).run();
    }
  }
  return true;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace diffattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace diffattn::kernels {

HWY_EXPORT(FusedForward);
HWY_EXPORT(TargetName);

bool attention_fwd_fused(const AttnParams& p, const fused::KvPages* pages) {
  return HWY_DYNAMIC_DISPATCH(FusedForward)(p, pages);
}

const char* fused_simd_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace diffattn::kernels
#endif
