// Entry points of the fused CPU backend (fused_fwd.cpp, fused_bwd.cpp, decode.cpp), called by
// dispatch.cpp after the params are checked, and the packing helpers their kernels share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "diffattn/kernels/attention.h"
#include "hwy/aligned_allocator.h"
#include "kernels/fused_traits.h"
#include "kernels/indexing.h"

namespace diffattn::kernels {

namespace fused {
// One sequence's K/V kept in the blocks of a pool (attention_paged's rows of a sequence, run by
// the tiled forward or the split-KV path): the problem's k and v (in kv_dtype) point at the pools'
// starts, and key row j lies at row table[j / block_size] * block_size + j % block_size of them,
// at the problem's row and head strides (its batch strides are unused: B = 1).
struct KvPages {
  const int32_t* table = nullptr;
  int64_t block_size = 0;
  // The pool row of key j.
  int64_t row(int64_t j) const {
    return static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
  }
};
}  // namespace fused

// The tiled forward (any Tq): FlashAttention-2 style, both maps per K/V tile. K/V are packed
// tile by tile from where they lie: contiguous or (pages non-null, B = 1) the blocks of a pool,
// float32 or 16-bit (widened as they are packed).
// false (nothing written) for a causal call with more than one query row whose v holds a NaN
// or Inf: its tile products would spread it to rows that never see that key. The caller runs
// the reference instead.
bool attention_fwd_fused(const AttnParams& p, const fused::KvPages* pages = nullptr);
// The split-KV forward for a few query rows against a long cache (signed or standard); K/V
// contiguous or (pages non-null, B = 1) in the blocks of a pool.
void attention_decode_fused(const AttnDecodeParams& p, const fused::KvPages* pages = nullptr);
// The paged decode of B one-row sequences (decode.cpp), params already checked.
void attention_decode_paged_fused(const PagedAttnParams& p);
// The FlashAttention-2 style backward (signed differential or standard attention).
void attention_bwd_fused(const AttnBwdParams& p);


namespace fused {

using Buffer = hwy::AlignedFreeUniquePtr<float[]>;
inline Buffer alloc(int64_t n) { return hwy::AllocateAligned<float>(static_cast<size_t>(n > 0 ? n : 1)); }

// A per-thread buffer that only grows (slot 0..7): a call that fits reuses it, so decoding, one
// call per token, allocates nothing after its first call. Each thread keeps the largest size
// it has needed until it exits.
inline float* scratch(int slot, int64_t n) {
  thread_local Buffer bufs[8];
  thread_local int64_t caps[8] = {};
  if (caps[slot] < n) {
    bufs[slot] = alloc(n);
    caps[slot] = n;
  }
  return bufs[slot].get();
}

// The log-sum-exp saved for a row, ln(sum exp(scale q.k)) = (m + log2 l) ln 2, from its
// running max m (log2 units) and sum l: computed in double and rounded once, since the
// backward rebuilds every probability of the row from it (a coherent error of the whole row).
// +inf for a row that sees no key (l = 0).
inline float lse_of(float m, float l) {
  if (l == 0) return std::numeric_limits<float>::infinity();
  return static_cast<float>((static_cast<double>(m) + std::log2(static_cast<double>(l))) *
                            0.69314718055994530942);
}

// Number of keys query row i sees among keys [j0, j0 + nk): its mask inside one tile.
inline int64_t visible_in_tile(const AttnProblem& p, int64_t i, int64_t j0, int64_t nk) {
  if (!p.causal) return nk;
  return std::clamp<int64_t>(p.last_key(i) + 1 - j0, 0, nk);
}

// dst (rows x ld) <- rows of `n` floats at src + t * stride for t < valid, zeros elsewhere
// (padding rows and columns n..ld).
inline void pack_rows(float* dst, int64_t ld, int64_t rows, const float* src, int64_t stride,
                      int64_t valid, int64_t n) {
  for (int64_t t = 0; t < rows; ++t) {
    float* d = dst + t * ld;
    if (t < valid) {
      std::memcpy(d, src + t * stride, static_cast<size_t>(n) * sizeof(float));
      std::fill(d + n, d + ld, 0.0f);
    } else {
      std::fill(d, d + ld, 0.0f);
    }
  }
}

// dst (n x cols), transposed: dst[d * cols + t] = src[t * stride + d] for t < valid, 0 beyond.
inline void pack_transposed(float* dst, int64_t cols, const float* src, int64_t stride,
                            int64_t valid, int64_t n) {
  for (int64_t d = 0; d < n; ++d) std::fill(dst + d * cols + valid, dst + (d + 1) * cols, 0.0f);
  for (int64_t t = 0; t < valid; ++t) {
    const float* s = src + t * stride;
    for (int64_t d = 0; d < n; ++d) dst[d * cols + t] = s[d];
  }
}

}  // namespace fused
}  // namespace diffattn::kernels
