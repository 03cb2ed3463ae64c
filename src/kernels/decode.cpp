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

#include <alloca.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "diffattn/dtype.h"
#include "diffattn/runtime.h"
#include "hwy/cache_control.h"
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

// float32 of one K/V element, and a row of them: the cache's storage types (float, bfloat16,
// float16) widened on load; all arithmetic is float32.
HWY_INLINE float ScalarF32(float x) { return x; }
HWY_INLINE float ScalarF32(hwy::bfloat16_t x) {
  uint16_t bits;
  std::memcpy(&bits, &x, 2);
  return bf16_to_f32(bits);
}
HWY_INLINE float ScalarF32(hwy::float16_t x) {
  uint16_t bits;
  std::memcpy(&bits, &x, 2);
  return f16_to_f32(bits);
}

// dst[0, n) = float32 of src[0, n).
template <typename E>
HWY_INLINE void WidenRow(const E* HWY_RESTRICT src, float* HWY_RESTRICT dst, size_t n) {
  const DF d;
  const hn::Rebind<E, DF> de;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const VF a = hn::PromoteTo(d, hn::LoadU(de, src + i));
    const VF b = hn::PromoteTo(d, hn::LoadU(de, src + i + N));
    hn::StoreU(a, d, dst + i);
    hn::StoreU(b, d, dst + i + N);
  }
  for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(de, src + i)), d, dst + i);
  for (; i < n; ++i) dst[i] = ScalarF32(src[i]);
}

// Asks for the cache lines of [p, p + bytes) into L2 ahead of their use: decode streams the
// cache and needs many lines in flight per core to come near the read bandwidth, also while
// it computes on the tile it has.
HWY_INLINE void PrefetchSpan(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 2);
}

// The cache of batch b as elements of type E (float: p.k/p.v; 16-bit: p.k16/p.v16).
template <typename E>
struct CacheRows {
  const E* k;
  const E* v;
  int64_t k_rs, k_hs, v_rs, v_hs;
  int64_t k_span, v_span;  // bytes from a row's first head to its last element
  CacheRows(const AttnProblem& p, int64_t b) {
    if constexpr (std::is_same_v<E, float>) {
      k = p.k;
      v = p.v;
    } else {
      k = reinterpret_cast<const E*>(p.k16);
      v = reinterpret_cast<const E*>(p.v16);
    }
    k += b * p.k_batch_stride;
    v += b * p.v_batch_stride;
    k_rs = p.k_row_stride, k_hs = p.k_head_stride, v_rs = p.v_row_stride, v_hs = p.v_head_stride;
    k_span = static_cast<int64_t>(sizeof(E)) * ((p.key_heads() - 1) * k_hs + p.D);
    v_span = static_cast<int64_t>(sizeof(E)) * ((p.G - 1) * v_hs + p.Dv);
  }
};

// One chunk of keys of batch b for every group: partial m (M), l (L) and O of each row.
// s: (G * Rg, Bk) scores of one tile; kv: for 16-bit caches, room for one tile of K and V
// widened to float32 (Bk * (key_heads * D + G * Dv) floats).
template <typename E>
void DecodeChunk(const AttnDecodeParams& p, const DecodeLayout& f, int64_t b, int64_t ch,
                 float* s, float* M, float* L, float* O, float* kv) {
  constexpr bool kWide = std::is_same_v<E, float>;
  const Rows r(p);
  const CacheRows<E> c(p, b);
  const int64_t Bk = DecodeTiles::kBk, Rg = f.Rg, R = p.G * Rg, KH = p.key_heads();
  const int64_t kend = p.causal ? std::clamp<int64_t>(p.last_key(p.Tq - 1) + 1, 0, p.Tk) : p.Tk;
  const int64_t j_begin = ch * f.chunk, j_end = std::min(kend, j_begin + f.chunk);
  std::fill(M, M + R, kNegInf);
  std::fill(L, L + R, 0.0f);
  std::fill(O, O + R * f.Dvp, 0.0f);
  // Row row = g * Rg + rr, rr = (hh * maps + m) * Tq + t (map m of pair g * gs + hh, query
  // row t): its query and its key head, worked out once per chunk, not per key.
  const float** const rq = reinterpret_cast<const float**>(alloca(sizeof(float*) * R));
  int64_t* const rk = static_cast<int64_t*>(alloca(sizeof(int64_t) * R));
  for (int64_t row = 0; row < R; ++row) {
    const int64_t g = row / Rg, rr = row % Rg, t = rr % p.Tq, hm = rr / p.Tq;
    const int64_t h = g * f.gs + hm / p.maps;
    const int m = static_cast<int>(hm % p.maps);
    rq[row] = r.q(b, t, r.q_head(h, m));
    rk[row] = r.key_head(h, m);
  }
  float* const kt_buf = kv;
  float* const vt_buf = kv + Bk * KH * p.D;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += Bk) {
    const int64_t nk = std::min(Bk, j_end - j0);
    const bool more = j0 + Bk < j_end;  // a next tile to prefetch
    // The tile's K and V as float32 rows: the cache itself, or (16-bit) widened into kv.
    const float* kt;
    const float* vt;
    int64_t k_rs, k_hs, v_rs, v_hs;
    if constexpr (kWide) {
      kt = c.k + j0 * c.k_rs, vt = c.v + j0 * c.v_rs;
      k_rs = c.k_rs, k_hs = c.k_hs, v_rs = c.v_rs, v_hs = c.v_hs;
    } else {
      kt = kt_buf, vt = vt_buf;
      k_rs = KH * p.D, k_hs = p.D, v_rs = p.G * p.Dv, v_hs = p.Dv;
      for (int64_t j = 0; j < nk; ++j) {
        const E* kr = c.k + (j0 + j) * c.k_rs;
        for (int64_t h = 0; h < KH; ++h) {
          WidenRow(kr + h * c.k_hs, kt_buf + j * k_rs + h * p.D, static_cast<size_t>(p.D));
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        const E* vr = c.v + (j0 + j) * c.v_rs;
        for (int64_t g = 0; g < p.G; ++g) {
          WidenRow(vr + g * c.v_hs, vt_buf + j * v_rs + g * p.Dv, static_cast<size_t>(p.Dv));
        }
      }
    }
    // Scores key by key, every head of the key row in turn: the cache streams front to back.
    // The next tile's key and value rows are asked for meanwhile, one of each per key (and,
    // for the first tile of a float32 cache, read in place, this tile's value rows).
    for (int64_t j = 0; j < nk; ++j) {
      if (kWide && j0 == j_begin) PrefetchSpan(c.v + (j0 + j) * c.v_rs, c.v_span);
      if (more && j0 + Bk + j < j_end) {
        PrefetchSpan(c.k + (j0 + Bk + j) * c.k_rs, c.k_span);
        PrefetchSpan(c.v + (j0 + Bk + j) * c.v_rs, c.v_span);
      }
      const float* kr = kt + j * k_rs;
      for (int64_t row = 0; row < R; ++row) {
        s[row * Bk + j] = Dot(rq[row], kr + rk[row] * k_hs, static_cast<size_t>(p.D));
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
    // is a whole number of vectors, the tile is multiplied straight from the cache (or the
    // widened tile) with the rows' accumulators held in registers across the tile's keys.
    const bool direct = p.Dv % static_cast<int64_t>(hn::Lanes(DF())) == 0;
    for (int64_t g = 0; g < p.G && direct; ++g) {
      GemmAnyRows(static_cast<size_t>(Rg), static_cast<size_t>(p.Dv), static_cast<size_t>(nk),
                  s + g * Rg * Bk, static_cast<size_t>(Bk), 1, vt + g * v_hs,
                  static_cast<size_t>(v_rs), O + g * Rg * f.Dvp, static_cast<size_t>(f.Dvp), true);
    }
    for (int64_t j = 0; j < nk && !direct; ++j) {
      for (int64_t g = 0; g < p.G; ++g) {
        AccumulateRows(vt + j * v_rs + g * v_hs, static_cast<size_t>(p.Dv), s + g * Rg * Bk + j,
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
      static_cast<double>(dtype_size(p.kv_dtype)) * static_cast<double>(p.B * p.Tk) * static_cast<double>(p.key_heads() * p.D + p.G * p.Dv);
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
    float* const kv = p.kv_dtype == DType::F32
                          ? nullptr
                          : fused::scratch(7, DecodeTiles::kBk * (p.key_heads() * p.D + G * p.Dv));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / f.nch, ch = it % f.nch;
      float* const Mi = M + it * G * Rg;
      float* const Li = L + it * G * Rg;
      float* const Oi = O + it * G * Rg * f.Dvp;
      switch (p.kv_dtype) {
        case DType::F32: DecodeChunk<float>(p, f, b, ch, s, Mi, Li, Oi, kv); break;
        case DType::BF16: DecodeChunk<hwy::bfloat16_t>(p, f, b, ch, s, Mi, Li, Oi, kv); break;
        case DType::F16: DecodeChunk<hwy::float16_t>(p, f, b, ch, s, Mi, Li, Oi, kv); break;
      }
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
