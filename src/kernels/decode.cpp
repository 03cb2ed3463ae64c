// Split-KV decode: a few query rows against a long key/value cache. The cache is cut into
// chunks of keys processed in parallel; each chunk keeps a partial (max m, sum l, output O)
// per row of every group, and the partials merge exactly with log-sum-exp weights
// (FlashDecoding; ggml's split-KV path). Each K/V row is read once for all the query rows of
// its group: every pair (GQA), both maps, and V2's doubled queries. Memory bound: the kernel
// streams the cache once, whole rows (all heads) in order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd-inl.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "diffattn/runtime.h"
#include "kernels/fused.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::HWY_NAMESPACE {

namespace {

using fused::DecodeTiles;
using fused::kColPad;
using fused::round_up;

// Rows of group g: rr = (hh * maps + m) * Tq + t is map m of pair g * gs + hh, query row t.
struct DecodeLayout {
  int64_t gs, Rg, Dvp, chunk, nch;
  float c;
  DecodeLayout(const AttnDecodeParams& p, int threads) {
    gs = p.group_size();
    Rg = gs * p.maps * p.Tq;
    Dvp = round_up(p.Dv, kColPad);
    const int64_t Bk = DecodeTiles::kBk;
    if (p.key_chunk > 0) {
      chunk = round_up(p.key_chunk, Bk);
    } else {
      const int64_t splits =
          std::max<int64_t>(1, (DecodeTiles::kSplitsPerThread * threads + p.B - 1) / p.B);
      chunk = std::max(DecodeTiles::kMinChunk, round_up((p.Tk + splits - 1) / splits, Bk));
    }
    nch = std::max<int64_t>(1, (p.Tk + chunk - 1) / chunk);
    c = p.scale * kLog2e;
  }
};

// O[r] += p[r] * v over rows r < rows: v (n floats, n % Lanes == 0 not required) is loaded
// once per vector for every row.
void AccumulateRows(const float* HWY_RESTRICT v, size_t n, const float* HWY_RESTRICT pcol,
                    size_t p_stride, size_t rows, float* HWY_RESTRICT O, size_t ldo) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF vv = hn::LoadU(d, v + i);
    for (size_t r = 0; r < rows; ++r) {
      float* o = O + r * ldo + i;
      hn::StoreU(hn::MulAdd(hn::Set(d, pcol[r * p_stride]), vv, hn::LoadU(d, o)), d, o);
    }
  }
  for (; i < n; ++i) {
    for (size_t r = 0; r < rows; ++r) O[r * ldo + i] += pcol[r * p_stride] * v[i];
  }
}

// One chunk of keys of batch b for every group: partial m (M), l (L) and O of each row.
// s: (G * Rg, Bk) scores of one tile.
void DecodeChunk(const AttnDecodeParams& p, const DecodeLayout& f, int64_t b, int64_t ch,
                 float* s, float* M, float* L, float* O) {
  const Rows r(p);
  const int64_t Bk = DecodeTiles::kBk, Rg = f.Rg, R = p.G * Rg;
  const int64_t kend = p.causal ? std::clamp<int64_t>(p.last_key(p.Tq - 1) + 1, 0, p.Tk) : p.Tk;
  const int64_t j_begin = ch * f.chunk, j_end = std::min(kend, j_begin + f.chunk);
  std::fill(M, M + R, kNegInf);
  std::fill(L, L + R, 0.0f);
  std::fill(O, O + R * f.Dvp, 0.0f);
  // Row rr of group g: its query and key head.
  auto row_of = [&](int64_t g, int64_t rr, const float*& q, int64_t& kh) {
    const int64_t t = rr % p.Tq, hm = rr / p.Tq;
    const int64_t h = g * f.gs + hm / p.maps;
    const int m = static_cast<int>(hm % p.maps);
    q = r.q(b, t, r.q_head(h, m));
    kh = r.key_head(h, m);
  };
  for (int64_t j0 = j_begin; j0 < j_end; j0 += Bk) {
    const int64_t nk = std::min(Bk, j_end - j0);
    // Scores key by key, every head of the key row in turn: the cache streams front to back.
    for (int64_t j = 0; j < nk; ++j) {
      for (int64_t g = 0; g < p.G; ++g) {
        for (int64_t rr = 0; rr < Rg; ++rr) {
          const float* q;
          int64_t kh;
          row_of(g, rr, q, kh);
          s[(g * Rg + rr) * Bk + j] = Dot(q, r.k(b, j0 + j, kh), static_cast<size_t>(p.D));
        }
      }
    }
    for (int64_t row = 0; row < R; ++row) {
      float* srow = s + row * Bk;
      std::fill(srow + nk, srow + Bk, 0.0f);
      const int64_t t = (row % Rg) % p.Tq;
      const float alpha = OnlineSoftmaxRow(srow, Bk, fused::visible_in_tile(p, t, j0, nk), f.c,
                                           M[row], L[row]);
      if (alpha != 1.0f) {
        float* o = O + row * f.Dvp;
        for (int64_t d = 0; d < p.Dv; ++d) o[d] *= alpha;
      }
    }
    // O += P V, each value row read once for all the rows of its group. When a value row
    // is a whole number of vectors, the tile is multiplied straight from the cache with the
    // rows' accumulators held in registers across the tile's keys.
    const bool direct = p.Dv % static_cast<int64_t>(hn::Lanes(DF())) == 0;
    for (int64_t g = 0; g < p.G && direct; ++g) {
      GemmAnyRows(static_cast<size_t>(Rg), static_cast<size_t>(p.Dv), static_cast<size_t>(nk),
                  s + g * Rg * Bk, static_cast<size_t>(Bk), 1, r.v(b, j0, g),
                  static_cast<size_t>(p.v_row_stride), O + g * Rg * f.Dvp,
                  static_cast<size_t>(f.Dvp), true);
    }
    for (int64_t j = 0; j < nk && !direct; ++j) {
      for (int64_t g = 0; g < p.G; ++g) {
        AccumulateRows(r.v(b, j0 + j, g), static_cast<size_t>(p.Dv), s + g * Rg * Bk + j,
                       static_cast<size_t>(Bk), static_cast<size_t>(Rg), O + g * Rg * f.Dvp,
                       static_cast<size_t>(f.Dvp));
      }
    }
  }
}

}  // namespace

void FusedDecode(const AttnDecodeParams& p) {
  if (p.B == 0 || p.Tq == 0) return;
  const double bytes =
      4.0 * static_cast<double>(p.B * p.Tk) * static_cast<double>(p.key_heads() * p.D + p.G * p.Dv);
  const int threads =
      fused::Parallel::threads_for(bytes, fused::Parallel::kMinBytesPerThread, num_threads());
  const DecodeLayout f(p, threads);
  const int64_t Rg = f.Rg, G = p.G, items = p.B * f.nch;
  // Partial states of every (batch, chunk): M, L (B, nch, G, Rg), O (B, nch, G, Rg, Dvp).
  // Per-thread scratch that grows once (fused::scratch): no allocation per decoded token.
  float* const M = fused::scratch(0, items * G * Rg);
  float* const L = fused::scratch(1, items * G * Rg);
  float* const O = fused::scratch(2, items * G * Rg * f.Dvp);
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(threads, items)))
  {
    float* const s = fused::scratch(3, G * Rg * DecodeTiles::kBk);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      DecodeChunk(p, f, it / f.nch, it % f.nch, s, M + it * G * Rg, L + it * G * Rg,
                  O + it * G * Rg * f.Dvp);
    }
  }
  // Merge, chunk by chunk in order (deterministic): with Mx the max of the chunks' m,
  // l = sum_c l_c 2^(m_c - Mx) and O = sum_c O_c 2^(m_c - Mx); a chunk that saw no key has
  // m_c = -inf and weighs 0.
  const Rows r(p);
  const int64_t nbg = p.B * G;
#pragma omp parallel for num_threads(static_cast<int>(std::min<int64_t>(threads, nbg))) schedule(static)
  for (int64_t bg = 0; bg < nbg; ++bg) {
    const int64_t b = bg / G, g = bg % G;
    float* const acc = fused::scratch(4, Rg * f.Dvp);
    float* const lsum = fused::scratch(5, Rg);
    float* const mx = fused::scratch(6, Rg);
    for (int64_t rr = 0; rr < Rg; ++rr) {
      float m = kNegInf;
      for (int64_t ch = 0; ch < f.nch; ++ch) m = std::max(m, M[((b * f.nch + ch) * G + g) * Rg + rr]);
      mx[rr] = m;
      float l = 0;
      float* a = &acc[rr * f.Dvp];
      std::fill(a, a + p.Dv, 0.0f);
      if (m != kNegInf) {
        for (int64_t ch = 0; ch < f.nch; ++ch) {
          const int64_t base = ((b * f.nch + ch) * G + g) * Rg + rr;
          if (M[base] == kNegInf) continue;
          const float w = std::exp2(M[base] - m);
          l += L[base] * w;
          const float* o = O + base * f.Dvp;
          for (int64_t d = 0; d < p.Dv; ++d) a[d] += w * o[d];
        }
      }
      lsum[rr] = l;
    }
    // The epilogue, as the tiled forward's: out = A1 V - lam A2 V, lse, o2.
    for (int64_t hh = 0; hh < f.gs; ++hh) {
      const int64_t h = g * f.gs + hh;
      for (int64_t t = 0; t < p.Tq; ++t) {
        float inv[2] = {0, 0};
        for (int m = 0; m < p.maps; ++m) {
          const int64_t rr = (hh * p.maps + m) * p.Tq + t;
          const float l = lsum[rr];
          inv[m] = l == 0 ? 0.0f : 1.0f / l;  // NaN (a NaN score) stays NaN
          if (p.lse) {
            p.lse[r.lse_index(b, r.q_head(h, m), t)] = fused::lse_of(mx[rr], l);
          }
        }
        const float* o1 = &acc[((hh * p.maps) * p.Tq + t) * f.Dvp];
        float* out = r.out(b, t, h);
        if (p.maps == 1) {
          for (int64_t d = 0; d < p.Dv; ++d) out[d] = o1[d] * inv[0];
          continue;
        }
        const float* o2 = &acc[((hh * p.maps + 1) * p.Tq + t) * f.Dvp];
        const float lam = r.lam(b, t, h);
        for (int64_t d = 0; d < p.Dv; ++d) out[d] = o1[d] * inv[0] - lam * (o2[d] * inv[1]);
        if (p.o2) {
          float* dst = p.o2 + r.o2_index(b, t, h);
          for (int64_t d = 0; d < p.Dv; ++d) dst[d] = o2[d] * inv[1];
        }
      }
    }
  }
}

}  // namespace diffattn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace diffattn {

HWY_EXPORT(FusedDecode);

void attention_decode_fused(const AttnDecodeParams& p) { HWY_DYNAMIC_DISPATCH(FusedDecode)(p); }

}  // namespace diffattn
#endif
