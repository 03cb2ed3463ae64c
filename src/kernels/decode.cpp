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

#include "diffattn/base/dtype.h"
#include "diffattn/kernels/runtime.h"
#include "hwy/cache_control.h"
#include "kernels/fused.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::kernels::HWY_NAMESPACE {

namespace {

using fused::DecodeTiles;
using fused::kColPad;
using fused::round_up;

// Rows of group g: rr = hm * Tq + t, query row t of the map set hm = hh * maps + m (map m of
// pair g * gs + hh). With shared noise maps (noise_share ns > 1) the sets are the gs pairs' map-1
// rows, then one map-2 set per run of ns pairs, read from its first pair's query rows.
struct DecodeLayout {
  int64_t gs, ns, Rg, Dvp, chunk, nch;
  float c;
  // The pair (inside the group) and map of set hm, and the set of (pair hh, map m).
  int64_t set_pair(int64_t hm, int maps) const {
    return ns > 1 ? (hm < gs ? hm : (hm - gs) * ns) : hm / maps;
  }
  int set_map(int64_t hm, int maps) const {
    return ns > 1 ? (hm < gs ? 0 : 1) : static_cast<int>(hm % maps);
  }
  int64_t set_of(int64_t hh, int m, int maps) const {
    return ns > 1 ? (m == 0 ? hh : gs + hh / ns) : hh * maps + m;
  }
  DecodeLayout(const AttnDecodeParams& p, int threads) {
    gs = p.group_size();
    ns = p.maps == 2 ? p.noise_share : 1;
    Rg = (ns > 1 ? gs + gs / ns : gs * p.maps) * p.Tq;
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

// N elements at p as a float32 vector.
template <typename E>
HWY_INLINE VF LoadWide(DF d, const E* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<E, float>) {
    return hn::LoadU(d, p);
  } else {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<E, DF>(), p));
  }
}

// sum_d q[d] k[d] over n elements (any n), k widened as it is loaded.
template <typename E>
HWY_INLINE float DotWide(const float* HWY_RESTRICT q, const E* HWY_RESTRICT k, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    a0 = hn::MulAdd(hn::LoadU(d, q + i), LoadWide(d, k + i), a0);
    a1 = hn::MulAdd(hn::LoadU(d, q + i + N), LoadWide(d, k + i + N), a1);
  }
  for (; i + N <= n; i += N) a0 = hn::MulAdd(hn::LoadU(d, q + i), LoadWide(d, k + i), a0);
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
  for (; i < n; ++i) s += q[i] * ScalarF32(k[i]);
  return s;
}

// Scores of one query row against N keys at once (N = Lanes): lane j of the result is
// q . k[j] over D elements (D % Lanes == 0), k[j] widened as it is loaded. The N accumulators
// are summed into one vector by a tree of ConcatEven/ConcatOdd pairs (N - 1 adds, each of two
// whole vectors), instead of a horizontal sum per key.
template <typename E>
HWY_INLINE VF DotKeys(const float* HWY_RESTRICT q, const E* const* HWY_RESTRICT k, size_t D) {
  const DF d;
  constexpr size_t kN = hn::MaxLanes(DF());
#if HWY_TARGET == HWY_SCALAR  // one lane: one key
  (void)kN;
  return hn::Set(d, DotWide(q, k[0], D));
#else
  static_assert(kN % 4 == 0);
  HWY_DASSERT(hn::Lanes(d) == kN);  // fixed-width targets only (the dispatcher's set)
  VF acc[kN];
  // Four keys at a time: four independent FMA chains, four key pointers live (all kN would
  // not stay in registers). Unrolled whole so that acc stays in registers.
#pragma GCC unroll 16
  for (size_t j = 0; j < kN; j += 4) {
    VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    const E *k0 = k[j], *k1 = k[j + 1], *k2 = k[j + 2], *k3 = k[j + 3];
    for (size_t i = 0; i < D; i += kN) {
      const VF qv = hn::LoadU(d, q + i);
      a0 = hn::MulAdd(qv, LoadWide(d, k0 + i), a0);
      a1 = hn::MulAdd(qv, LoadWide(d, k1 + i), a1);
      a2 = hn::MulAdd(qv, LoadWide(d, k2 + i), a2);
      a3 = hn::MulAdd(qv, LoadWide(d, k3 + i), a3);
    }
    acc[j] = a0, acc[j + 1] = a1, acc[j + 2] = a2, acc[j + 3] = a3;
  }
  return SumsOfLanes(d, acc);  // lane j: the whole sum of accumulator j
#endif
}

// O[r] += p[r] * v over rows r < rows: v (n elements, n % Lanes == 0 not required) is loaded
// and widened once per vector for every row.
template <typename E>
void AccumulateRows(const E* HWY_RESTRICT v, size_t n, const float* HWY_RESTRICT pcol,
                    size_t p_stride, size_t rows, float* HWY_RESTRICT O, size_t ldo) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF vv = LoadWide(d, v + i);
    for (size_t r = 0; r < rows; ++r) {
      float* o = O + r * ldo + i;
      hn::StoreU(hn::MulAdd(hn::Set(d, pcol[r * p_stride]), vv, hn::LoadU(d, o)), d, o);
    }
  }
  for (; i < n; ++i) {
    const float x = ScalarF32(v[i]);
    for (size_t r = 0; r < rows; ++r) O[r * ldo + i] += pcol[r * p_stride] * x;
  }
}

// C (MR x NV vectors) += P (MR x kdim, row stride p_rs) V (kdim rows of ldv elements): the
// rows' accumulators stay in registers across the keys, each V vector is loaded (and
// widened) once for all MR rows.
template <typename E, int MR, int NV>
HWY_INLINE void PvKernel(DF d, size_t kdim, const float* HWY_RESTRICT pm, size_t p_rs,
                         const E* HWY_RESTRICT v, size_t ldv, float* HWY_RESTRICT c, size_t ldc) {
  const size_t N = hn::Lanes(d);
  VF acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int x = 0; x < NV; ++x) acc[r][x] = hn::Zero(d);
  }
  for (size_t kk = 0; kk < kdim; ++kk) {
    VF bv[NV];
    for (int x = 0; x < NV; ++x) bv[x] = LoadWide(d, v + kk * ldv + x * N);
    for (int r = 0; r < MR; ++r) {
      const VF av = hn::Set(d, pm[r * p_rs + kk]);
      for (int x = 0; x < NV; ++x) acc[r][x] = hn::MulAdd(av, bv[x], acc[r][x]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int x = 0; x < NV; ++x) {
      float* o = c + r * ldc + x * N;
      hn::StoreU(hn::Add(hn::LoadU(d, o), acc[r][x]), d, o);
    }
  }
}

// O (rows x cols) += P (rows x kdim) V (kdim x cols), cols % Lanes == 0.
template <typename E>
void PvTile(size_t rows, size_t cols, size_t kdim, const float* pm, size_t p_rs, const E* v,
            size_t ldv, float* c, size_t ldc) {
  const DF d;
  const size_t N = hn::Lanes(d);
  constexpr int NV = Micro::kNV;
  const size_t nvec = cols / N;
  auto block = [&]<int MR>(size_t r0) {
    size_t x = 0;
    // One or two rows (V1's two maps of one pair, a standard head): twice the columns per
    // pass, so each P entry is broadcast once per value row (V1's 128-wide rows in one pass).
    if constexpr (MR <= 2) {
      for (; x + 2 * NV <= nvec; x += 2 * NV) {
        PvKernel<E, MR, 2 * NV>(d, kdim, pm + r0 * p_rs, p_rs, v + x * N, ldv,
                                c + r0 * ldc + x * N, ldc);
      }
    }
    for (; x + NV <= nvec; x += NV) {
      PvKernel<E, MR, NV>(d, kdim, pm + r0 * p_rs, p_rs, v + x * N, ldv, c + r0 * ldc + x * N, ldc);
    }
    for (; x < nvec; ++x) {
      PvKernel<E, MR, 1>(d, kdim, pm + r0 * p_rs, p_rs, v + x * N, ldv, c + r0 * ldc + x * N, ldc);
    }
  };
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) block.template operator()<4>(r);
  for (; r + 2 <= rows; r += 2) block.template operator()<2>(r);
  for (; r < rows; ++r) block.template operator()<1>(r);
}

// Asks for the cache lines of [p, p + bytes) into L2 ahead of their use: decode streams the
// cache and needs many lines in flight per core to come near the read bandwidth, also while
// it computes on the tile it has.
HWY_INLINE void PrefetchSpan(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 2);
}

// Where key row j of one sequence's cache lies, as elements of type E (float for kv_dtype F32,
// the 16-bit words otherwise). Contiguous: row j at base + j * row stride (a KV cache with spare
// capacity). Paged: row j % bs of block table[j / bs] of a pool. run(j): how many rows from j
// on lie at the row stride from row j (a P V product over rows may not cross a block end).
template <typename E>
HWY_INLINE const E* AsE(const void* p) {
  return static_cast<const E*>(p);
}

template <typename E>
struct ContiguousKV {
  const E* k;
  const E* v;
  int64_t k_rs, v_rs, k_hs, v_hs;
  ContiguousKV(const AttnProblem& p, int64_t b)
      : k(AsE<E>(p.k) + b * p.k_batch_stride),
        v(AsE<E>(p.v) + b * p.v_batch_stride),
        k_rs(p.k_row_stride), v_rs(p.v_row_stride), k_hs(p.k_head_stride), v_hs(p.v_head_stride) {}
  HWY_INLINE const E* krow(int64_t j) const { return k + j * k_rs; }
  HWY_INLINE const E* vrow(int64_t j) const { return v + j * v_rs; }
  HWY_INLINE int64_t run(int64_t) const { return std::numeric_limits<int64_t>::max(); }
};

// One sequence's blocks as a problem addresses them (its k/v at the pools, its strides).
struct OnePaged {
  const AttnProblem& p;
  const fused::KvPages& pages;
};

template <typename E>
struct PagedKV {
  const E* k;  // the pools: (n_blocks, bs, key_heads, D), (n_blocks, bs, G, Dv)
  const E* v;
  fused::KvPages pages;  // this sequence's block ids: key j at pool row pages.row(j)
  int64_t k_rs, v_rs, k_hs, v_hs;
  PagedKV(const PagedAttnParams& pp, int64_t b)
      : k(AsE<E>(pp.k_pool)),
        v(AsE<E>(pp.v_pool)),
        pages{pp.block_tables + b * pp.table_stride, pp.block_size},
        k_rs(pp.key_heads() * pp.D), v_rs(pp.G * pp.Dv), k_hs(pp.D), v_hs(pp.Dv) {}
  PagedKV(const OnePaged& one, int64_t)
      : k(AsE<E>(one.p.k)),
        v(AsE<E>(one.p.v)),
        pages(one.pages),
        k_rs(one.p.k_row_stride), v_rs(one.p.v_row_stride),
        k_hs(one.p.k_head_stride), v_hs(one.p.v_head_stride) {}
  HWY_INLINE const E* krow(int64_t j) const { return k + pages.row(j) * k_rs; }
  HWY_INLINE const E* vrow(int64_t j) const { return v + pages.row(j) * v_rs; }
  HWY_INLINE int64_t run(int64_t j) const { return pages.block_size - j % pages.block_size; }
};

// Keys [j_begin, j_end) of sequence b for the groups [g0, g1): partial m (M), l (L) and O of
// each of their rows (M, L: (G, Rg); O: (G, Rg, Dvp); only the groups' rows are written).
// s: (G * Rg, Bk) scores of one tile. K and V are read in place as E (float, or a 16-bit
// cache widened to float32 in registers as each vector is loaded), row by row through kv.
template <typename E, typename KV>
void DecodeChunk(const AttnDecodeParams& p, const DecodeLayout& f, int64_t b, int64_t g0,
                 int64_t g1, int64_t j_begin, int64_t j_end, const KV& kv, float* s, float* M,
                 float* L, float* O) {
  const Rows r(p);
  const int64_t Bk = DecodeTiles::kBk, Rg = f.Rg, r0 = g0 * Rg, r1 = g1 * Rg;
  std::fill(M + r0, M + r1, kNegInf);
  std::fill(L + r0, L + r1, 0.0f);
  std::fill(O + r0 * f.Dvp, O + r1 * f.Dvp, 0.0f);
  // Row row = g * Rg + rr, rr = (hh * maps + m) * Tq + t (map m of pair g * gs + hh, query
  // row t): its query and its key head, worked out once per chunk, not per key.
  const float** const rq = static_cast<const float**>(alloca(sizeof(float*) * r1));
  int64_t* const rk = static_cast<int64_t*>(alloca(sizeof(int64_t) * r1));
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t g = row / Rg, rr = row % Rg, t = rr % p.Tq, hm = rr / p.Tq;
    const int64_t h = g * f.gs + f.set_pair(hm, p.maps);
    const int m = f.set_map(hm, p.maps);
    rq[row] = r.q(b, t, r.q_head(h, m));
    rk[row] = r.key_head(h, m) * kv.k_hs;
  }
  // The key heads and value heads the groups read: what to ask the memory for, per row.
  const int64_t kh0 = r.key_head(g0 * f.gs, 0), kh1 = r.key_head((g1 - 1) * f.gs, p.maps - 1);
  const int64_t k_off = kh0 * kv.k_hs, v_off = g0 * kv.v_hs;
  const int64_t k_span = static_cast<int64_t>(sizeof(E)) * ((kh1 - kh0) * kv.k_hs + p.D);
  const int64_t v_span = static_cast<int64_t>(sizeof(E)) * ((g1 - 1 - g0) * kv.v_hs + p.Dv);
  const bool direct = p.Dv % static_cast<int64_t>(hn::Lanes(DF())) == 0;
  // Scores a whole vector of keys at a time (DotKeys) when a key head is a whole number of
  // vectors; else key by key.
  const int64_t NL = static_cast<int64_t>(hn::Lanes(DF()));
  const bool by_vector = HWY_TARGET != HWY_SCALAR && p.D % NL == 0 && Bk % NL == 0;
  const int64_t R = r1 - r0;
  float* const alpha = static_cast<float*>(alloca(sizeof(float) * static_cast<size_t>(R)));
  const E* kp[DecodeTiles::kBk];  // the tile's key rows (the last one repeated past its end)
  for (int64_t j0 = j_begin; j0 < j_end; j0 += Bk) {
    const int64_t nk = std::min(Bk, j_end - j0);
    for (int64_t j = 0; j < Bk; ++j) kp[j] = kv.krow(j0 + std::min(j, nk - 1));
    // Scores row by row, a vector of keys at a time. Meanwhile the next tile's key rows are
    // asked for, a few before each row's scores (and,
    // in the first tile, this tile's value rows); the next tile's value rows are asked for
    // during the P V product below. The requests are spread over all the tile's compute, so
    // the memory system always has lines in flight.
    if (j0 == j_begin) {
      for (int64_t j = 0; j < nk; ++j) PrefetchSpan(kv.vrow(j0 + j) + v_off, v_span);
    }
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t i = row - r0;
      for (int64_t j = i * Bk / R; j < (i + 1) * Bk / R && j0 + Bk + j < j_end; ++j) {
        PrefetchSpan(kv.krow(j0 + Bk + j) + k_off, k_span);
      }
      float* srow = s + row * Bk;
      if (by_vector) {
        const E* kr[hn::MaxLanes(DF())];
        for (int64_t jb = 0; jb < nk; jb += NL) {
          for (int64_t j = 0; j < NL; ++j) kr[j] = kp[jb + j] + rk[row];
          hn::StoreU(DotKeys(rq[row], kr, static_cast<size_t>(p.D)), DF(), srow + jb);
        }
      } else {
        for (int64_t j = 0; j < nk; ++j) {
          srow[j] = DotWide(rq[row], kp[j] + rk[row], static_cast<size_t>(p.D));
        }
      }
    }
    // Scores past nk (stale or unset) are masked to -inf by the softmax: visible <= nk.
    const auto visible = [&](size_t i) -> size_t {
      const int64_t t = ((r0 + static_cast<int64_t>(i)) % Rg) % p.Tq;
      return static_cast<size_t>(fused::visible_in_tile(p, t, j0, nk));
    };
    OnlineSoftmaxRows(s + r0 * Bk, Bk, static_cast<size_t>(R), visible, f.c, M + r0, L + r0,
                      alpha);
    for (int64_t row = r0; row < r1; ++row) {
      const float a = alpha[row - r0];
      if (a != 1.0f) {
        const DF d;
        float* o = O + row * f.Dvp;  // Dvp: whole vectors
        for (int64_t x = 0; x < p.Dv; x += NL) hn::StoreU(hn::Mul(hn::LoadU(d, o + x), hn::Set(d, a)), d, o + x);
      }
    }
    // O += P V, each value row read once for all the rows of its group: when a value row is
    // a whole number of vectors, with the rows' accumulators in registers across the tile's
    // keys (over the keys of one block at a time: a paged cache's rows are strided only
    // within it). Before each group, a share of the next tile's value rows is asked for.
    const int64_t ng = g1 - g0;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t i = g - g0;
      for (int64_t j = i * Bk / ng; j < (i + 1) * Bk / ng && j0 + Bk + j < j_end; ++j) {
        PrefetchSpan(kv.vrow(j0 + Bk + j) + v_off, v_span);
      }
      const float* pg = s + g * Rg * Bk;
      float* og = O + g * Rg * f.Dvp;
      if (direct) {
        for (int64_t a = 0; a < nk;) {
          const int64_t n = std::min(nk - a, kv.run(j0 + a));
          PvTile(static_cast<size_t>(Rg), static_cast<size_t>(p.Dv), static_cast<size_t>(n),
                 pg + a, static_cast<size_t>(Bk), kv.vrow(j0 + a) + g * kv.v_hs,
                 static_cast<size_t>(kv.v_rs), og, static_cast<size_t>(f.Dvp));
          a += n;
        }
        continue;
      }
      for (int64_t j = 0; j < nk; ++j) {
        AccumulateRows(kv.vrow(j0 + j) + g * kv.v_hs, static_cast<size_t>(p.Dv), pg + j,
                       static_cast<size_t>(Bk), static_cast<size_t>(Rg), og,
                       static_cast<size_t>(f.Dvp));
      }
    }
  }
}

// The work of one call: slot i is (sequence slot_b[i], keys [slot_j0[i], slot_j1[i])); the
// slots of sequence b are first[b] .. first[b + 1] - 1, in key order. Each slot is cut into
// gsplit slices of key/value-head groups, so a call with few slots (one short sequence, a few)
// still has work for every thread. Kept per thread and reused: no allocation per token.
struct DecodeWork {
  std::vector<int64_t> slot_b, slot_j0, slot_j1, first;
  int64_t gsplit = 1;
  void add_sequence(int64_t b, int64_t kend, int64_t nch, int64_t chunk) {
    first.push_back(static_cast<int64_t>(slot_b.size()));
    for (int64_t ch = 0; ch < nch; ++ch) {
      slot_b.push_back(b);
      slot_j0.push_back(ch * chunk);
      slot_j1.push_back(std::min(kend, (ch + 1) * chunk));
    }
  }
  int64_t slots() const { return static_cast<int64_t>(slot_b.size()); }
  // Slices of head groups for `threads` threads: whole slots when they are enough.
  void split_groups(int64_t G, int threads) {
    const int64_t want = DecodeTiles::kSplitsPerThread * threads, n = slots();
    gsplit = (threads > 1 && n < want) ? std::min<int64_t>(G, (want + n - 1) / n) : 1;
  }
};

// Runs every (slot, group slice) of w and merges each sequence's slots into p.out (lse, o2).
// KV<E>(src, b) addresses sequence b's rows: ContiguousKV (src: the problem) or PagedKV (src:
// the paged params).
template <template <typename> class KV, typename Src>
void RunDecode(const AttnDecodeParams& p, const DecodeLayout& f, int threads, const DecodeWork& w,
               const Src& src) {
  const int64_t Rg = f.Rg, G = p.G, slots = w.slots(), items = slots * w.gsplit;
  // Partial states of every slot: M, L (slots, G, Rg), O (slots, G, Rg, Dvp).
  // Per-thread scratch that grows once (fused::scratch): no allocation per decoded token.
  float* const M = fused::scratch(0, slots * G * Rg);
  float* const L = fused::scratch(1, slots * G * Rg);
  float* const O = fused::scratch(2, slots * G * Rg * f.Dvp);
  const Rows r(p);
  const int64_t nbg = p.B * G;
  // One parallel region for the chunks and the merge: a second region would wake the sleeping
  // threads again (with OMP_WAIT_POLICY=passive, which the tool sets on a busy machine, 0.1 ms
  // or more on this VM per call), and dynamic scheduling lets the first thread start on both
  // while another is still waking.
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(threads, std::max(items, nbg))))
  {
    float* const s = fused::scratch(3, G * Rg * DecodeTiles::kBk);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t i = it / w.gsplit, gi = it % w.gsplit;
      const int64_t g0 = gi * G / w.gsplit, g1 = (gi + 1) * G / w.gsplit;
      if (g0 == g1) continue;
      const int64_t b = w.slot_b[static_cast<size_t>(i)];
      const int64_t j0 = w.slot_j0[static_cast<size_t>(i)], j1 = w.slot_j1[static_cast<size_t>(i)];
      float* const Mi = M + i * G * Rg;
      float* const Li = L + i * G * Rg;
      float* const Oi = O + i * G * Rg * f.Dvp;
      switch (p.kv_dtype) {
        case DType::F32:
          DecodeChunk<float>(p, f, b, g0, g1, j0, j1, KV<float>(src, b), s, Mi, Li, Oi);
          break;
        case DType::BF16:
          DecodeChunk<hwy::bfloat16_t>(p, f, b, g0, g1, j0, j1, KV<hwy::bfloat16_t>(src, b), s,
                                       Mi, Li, Oi);
          break;
        case DType::F16:
          DecodeChunk<hwy::float16_t>(p, f, b, g0, g1, j0, j1, KV<hwy::float16_t>(src, b), s,
                                      Mi, Li, Oi);
          break;
      }
    }
    // Merge (after the loop's barrier), slot by slot in key order (deterministic): with Mx the
    // max of the slots' m, l = sum_c l_c 2^(m_c - Mx) and O = sum_c O_c 2^(m_c - Mx); a slot
    // that saw no key has m_c = -inf and weighs 0.
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < nbg; ++bg) {
      const int64_t b = bg / G, g = bg % G;
      const int64_t c0 = w.first[static_cast<size_t>(b)], c1 = w.first[static_cast<size_t>(b) + 1];
      float* const acc = fused::scratch(4, Rg * f.Dvp);
      float* const lsum = fused::scratch(5, Rg);
      float* const mx = fused::scratch(6, Rg);
      for (int64_t rr = 0; rr < Rg; ++rr) {
        float m = kNegInf;
        for (int64_t ch = c0; ch < c1; ++ch) m = std::max(m, M[(ch * G + g) * Rg + rr]);
        mx[rr] = m;
        float l = 0;
        float* a = &acc[rr * f.Dvp];
        std::fill(a, a + p.Dv, 0.0f);
        if (m != kNegInf) {
          for (int64_t ch = c0; ch < c1; ++ch) {
            const int64_t base = (ch * G + g) * Rg + rr;
            if (M[base] == kNegInf) continue;
            const float wt = std::exp2(M[base] - m);
            l += L[base] * wt;
            const float* o = O + base * f.Dvp;
            for (int64_t d = 0; d < p.Dv; ++d) a[d] += wt * o[d];
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
            const int64_t rr = f.set_of(hh, m, p.maps) * p.Tq + t;
            const float l = lsum[rr];
            inv[m] = l == 0 ? 0.0f : 1.0f / l;  // NaN (a NaN score) stays NaN
            if (p.lse) {
              p.lse[r.lse_index(b, r.q_head(h, m), t)] = fused::lse_of(mx[rr], l);
            }
          }
          const float* o1 = &acc[(f.set_of(hh, 0, p.maps) * p.Tq + t) * f.Dvp];
          float* out = r.out(b, t, h);
          if (p.maps == 1) {
            for (int64_t d = 0; d < p.Dv; ++d) out[d] = o1[d] * inv[0];
            continue;
          }
          const float* o2 = &acc[(f.set_of(hh, 1, p.maps) * p.Tq + t) * f.Dvp];
          const float lam = r.lam(b, t, h);
          for (int64_t d = 0; d < p.Dv; ++d) out[d] = o1[d] * inv[0] - lam * (o2[d] * inv[1]);
          if (p.o2) {
            float* dst = p.o2 + r.o2_index(b, t, h);
            for (int64_t d = 0; d < p.Dv; ++d) dst[d] = o2[d] * inv[1];
          }
        }
      }
    }
  }  // omp parallel
}

// Threads for a decode call over `keys` cached positions (all sequences together) of p's
// layout (fused_traits.h, Parallel): by the K/V bytes streamed when idle threads sleep, by the
// bytes times the query rows per key head when they spin.
int DecodeThreads(const AttnDecodeParams& p, int64_t keys) {
  const double bytes = static_cast<double>(dtype_size(p.kv_dtype)) * static_cast<double>(keys) *
                       static_cast<double>(p.key_heads() * p.D + p.G * p.Dv);
  if (idle_threads_sleep()) {
    return fused::Parallel::threads_for(bytes, fused::Parallel::kMinBytesPerThread, num_threads());
  }
  const double rows = static_cast<double>(p.H * p.maps * p.Tq) / static_cast<double>(p.key_heads());
  return fused::Parallel::threads_for(bytes * std::max(1.0, rows),
                                      fused::Parallel::kMinDecodeWorkPerThread, num_threads());
}

}  // namespace

void FusedDecode(const AttnDecodeParams& p, const fused::KvPages* pages) {
  if (p.B == 0 || p.Tq == 0) return;
  const int threads = DecodeThreads(p, p.B * p.Tk);
  const DecodeLayout f(p, threads);
  // Every batch the same f.nch splits, up to the last key the last query row sees.
  const int64_t kend = p.causal ? std::clamp<int64_t>(p.last_key(p.Tq - 1) + 1, 0, p.Tk) : p.Tk;
  thread_local DecodeWork w;
  w.slot_b.clear(), w.slot_j0.clear(), w.slot_j1.clear(), w.first.clear();
  for (int64_t b = 0; b < p.B; ++b) w.add_sequence(b, kend, f.nch, f.chunk);
  w.first.push_back(w.slots());
  w.split_groups(p.G, threads);
  if (pages != nullptr) {  // B = 1: the sequence's blocks
    RunDecode<PagedKV>(p, f, threads, w, OnePaged{p, *pages});
  } else {
    RunDecode<ContiguousKV>(p, f, threads, w, static_cast<const AttnProblem&>(p));
  }
}

void FusedDecodePaged(const PagedAttnParams& pp) {
  if (pp.B == 0) return;
  // The call as a decode of B one-row sequences whose keys all count (causal is implied: the
  // new row's key is the last one); q, lam and out are addressed as a forward's, K/V by block.
  AttnDecodeParams p;
  p.B = pp.B, p.Tq = 1, p.H = pp.H, p.G = pp.G, p.D = pp.D, p.Dv = pp.Dv, p.maps = pp.maps;
  p.shared_keys = pp.shared_keys, p.lam_per_token = pp.lam_per_token, p.causal = false;
  p.noise_share = pp.noise_share;
  p.scale = pp.scale, p.mode = DiffMode::Signed, p.kv_dtype = pp.kv_dtype;
  p.q = pp.q, p.lam = pp.lam, p.out = pp.out;
  p.q_batch_stride = pp.q_row_stride, p.q_head_stride = pp.q_head_stride;
  p.q_row_stride = pp.q_row_stride;
  p.o_batch_stride = pp.o_row_stride, p.o_head_stride = pp.o_head_stride;
  p.o_row_stride = pp.o_row_stride;
  p.key_chunk = pp.key_chunk;
  int64_t keys = 0;
  for (int64_t b = 0; b < pp.B; ++b) {
    keys += pp.seq_lens[b];
    p.Tk = std::max(p.Tk, pp.seq_lens[b]);
  }
  const int threads = DecodeThreads(p, keys);
  // The split size the longest sequence would get as a contiguous decode of batch B; each
  // sequence takes as many splits of that size as its length needs (at least one, so a
  // sequence with no key gets its zero output from the merge).
  const DecodeLayout f(p, threads);
  thread_local DecodeWork w;
  w.slot_b.clear(), w.slot_j0.clear(), w.slot_j1.clear(), w.first.clear();
  for (int64_t b = 0; b < pp.B; ++b) {
    const int64_t len = pp.seq_lens[b];
    w.add_sequence(b, len, std::max<int64_t>(1, (len + f.chunk - 1) / f.chunk), f.chunk);
  }
  w.first.push_back(w.slots());
  w.split_groups(pp.G, threads);
  RunDecode<PagedKV>(p, f, threads, w, pp);
}

}  // namespace diffattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace diffattn::kernels {

HWY_EXPORT(FusedDecode);
HWY_EXPORT(FusedDecodePaged);

void attention_decode_fused(const AttnDecodeParams& p, const fused::KvPages* pages) {
  HWY_DYNAMIC_DISPATCH(FusedDecode)(p, pages);
}
void attention_decode_paged_fused(const PagedAttnParams& p) {
  HWY_DYNAMIC_DISPATCH(FusedDecodePaged)(p);
}

}  // namespace diffattn::kernels
#endif
