// The attention layers of the Differential Transformer (docs/FORMAT.md, "The computation"):
// DIFF V1 (arXiv:2410.05258, Eqs. 1-3), DIFF V2 and standard softmax attention, each a
// forward/backward pair over the kernel API (attention_fwd / attention_bwd). Every function runs
// its hot ops (products, norms, RoPE, attention) through the runner's ExecContext (backend.h).
//
// The q, k, v (and V2's lambda) projections are one stacked weight (n_proj, C), so one sgemm
// produces a (B, T, n_proj) buffer that the kernels read through row strides, no copies:
//   [ q (q_heads*D) | k (k_heads*D) | v (G*Dv) | lambda logits (H, V2 only) ]
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/base/tensor.h"
#include "diffattn/base/memory.h"
#include "diffattn/kernels/attention.h"
#include "diffattn/nn/backend.h"

namespace diffattn::nn {

enum class AttnKind { DiffV1, DiffV2, Standard };

const char* attn_kind_name(AttnKind k);  // "diff_v1", "diff_v2", "standard"

struct AttnLayerShape {
  AttnKind kind = AttnKind::DiffV1;
  int64_t C = 0;          // d_model
  int64_t H = 0;          // V1: pairs; V2: output heads (2H query heads); standard: heads
  int64_t G = 0;          // key/value heads
  int64_t D = 0;          // query/key head size
  float eps = 1e-5f;      // V1's per-head RMSNorm
  float lambda_init = 0;  // V1
  int64_t noise_share = 1;  // V1: pairs sharing one noise map (equal map-2 query rows)
  int maps() const { return kind == AttnKind::Standard ? 1 : 2; }
  int64_t q_heads() const { return maps() * H; }
  int64_t k_heads() const { return kind == AttnKind::DiffV1 ? 2 * G : G; }
  int64_t Dv() const { return kind == AttnKind::DiffV1 ? 2 * D : D; }
  int64_t n_q() const { return q_heads() * D; }
  int64_t n_k() const { return k_heads() * D; }
  int64_t n_v() const { return G * Dv(); }
  int64_t n_lam() const { return kind == AttnKind::DiffV2 ? H : 0; }
  int64_t n_proj() const { return n_q() + n_k() + n_v() + n_lam(); }
  int64_t n_out() const { return H * Dv(); }
};

// A layer's weights: the two projections in their stored type (weights kept as loaded may be
// BF16/F16), the small vectors as float32.
struct AttnLayerWeights {
  TensorView proj;                        // (n_proj, C): q_proj, k_proj, v_proj[, lambda_proj] stacked
  TensorView out_proj;                    // (C, H*Dv)
  const float* proj_bias = nullptr;     // (n_q + n_k + n_v) or null: q, k, v biases stacked
  const float* out_bias = nullptr;      // (C) or null
  const float* lambda_q1 = nullptr;     // (D) V1
  const float* lambda_k1 = nullptr;     // (D) V1
  const float* lambda_q2 = nullptr;     // (D) V1
  const float* lambda_k2 = nullptr;     // (D) V1
  const float* subln = nullptr;         // (2D) V1
};
// Their gradients (float32 training weights; biases are not trained).
struct AttnLayerGrads {
  float* proj = nullptr;
  float* out_proj = nullptr;
  float* lambda_q1 = nullptr;
  float* lambda_k1 = nullptr;
  float* lambda_q2 = nullptr;
  float* lambda_k2 = nullptr;
  float* subln = nullptr;
};

// What the forward saves for the backward (sized by attn_acts_resize).
struct AttnLayerActs {
  std::vector<float> proj;      // (B, T, n_proj): q and k after RoPE, v, lambda logits
  std::vector<float> lam;       // V1: (H) the layer's lambda broadcast; V2: (B, T, H) sigmoid
  std::vector<float> att;       // (B, T, H, Dv) the operator's output
  std::vector<float> lse;       // (B, maps*H, T)
  std::vector<float> o2;        // (B, T, H, Dv) map 2's output (maps == 2)
  std::vector<float> normed;    // V1: (B, T, H, 2D) (1 - lambda_init) * rmsnorm(att, subln)
  std::vector<float> sub_rstd;  // V1: (B, T, H)
  double lambda = 0;            // V1: the layer's lambda (Eq. 2)
  double e1 = 0, e2 = 0;        // V1: exp(lambda_q1 . lambda_k1), exp(lambda_q2 . lambda_k2)
};

// A key/value cache with spare capacity for one layer: rows [0, len) are filled. One array of
// keys and one of values, elements of kv_dtype (F32, or BF16/F16: rounded once, when a row is
// appended; attention reads them with float32 arithmetic).
struct KVCache {
  int64_t B = 0, capacity = 0, len = 0;
  int64_t n_k = 0, n_v = 0;  // elements per position: k_heads * D, G * Dv
  DType kv_dtype = DType::F32;
  // On cache lines, values half a page off the keys (base/memory.h); bytes.
  PageVector<uint8_t> k;                    // (B, capacity, k_heads, D) of kv_dtype
  PageVector<uint8_t, kValuePageOffset> v;  // (B, capacity, G, Dv) of kv_dtype
  // Element i (a position times n_k or n_v, plus a column) of the keys or values.
  void* k_at(int64_t i) { return k.data() + i * static_cast<int64_t>(dtype_size(kv_dtype)); }
  void* v_at(int64_t i) { return v.data() + i * static_cast<int64_t>(dtype_size(kv_dtype)); }
  const void* k_at(int64_t i) const { return k.data() + i * static_cast<int64_t>(dtype_size(kv_dtype)); }
  const void* v_at(int64_t i) const { return v.data() + i * static_cast<int64_t>(dtype_size(kv_dtype)); }
  void reset(const AttnLayerShape& s, int64_t B, int64_t capacity,
             DType kv_dtype = DType::F32);
};

// V1's lambda (Eq. 2): exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init; e1, e2 the exponentials.
double v1_lambda(const AttnLayerWeights& w, const AttnLayerShape& s, double* e1 = nullptr,
                 double* e2 = nullptr);

// out (B, T, C) = attention layer of inp (B, T, C) (already normalised), causal, each batch's T
// rows against themselves (training, evaluation: inference runs through a KV store's blocks,
// attn_layer_fwd_paged). cos_t/sin_t (T, D/2): the rows' RoPE angles.
// save_stats: keep lse and o2 for a backward (training).
void attn_layer_fwd(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                    const AttnLayerWeights& w, const AttnLayerShape& s, int64_t B, int64_t T,
                    const float* cos_t, const float* sin_t, bool save_stats);

// The paged KV store of one layer (serving): n_blocks blocks of block_size positions shared by
// many sequences, each holding a table of block ids (serve::BlockAllocator hands them out).
// Position j of a sequence is row j % block_size of block table[j / block_size]. One array of
// keys and one of values, elements of kv_dtype (F32, BF16 or F16), allocated once and not
// zeroed: a page is touched when a block on it is first written.
struct KVPool {
  int64_t n_blocks = 0, block_size = 0;
  int64_t n_k = 0, n_v = 0;  // elements per position: k_heads * D, G * Dv
  DType kv_dtype = DType::F32;
  // On cache lines, values half a page off the keys (base/memory.h); bytes.
  PageArray<uint8_t> k;                    // (n_blocks, block_size, k_heads, D) of kv_dtype
  PageArray<uint8_t, kValuePageOffset> v;  // (n_blocks, block_size, G, Dv) of kv_dtype
  // Element i (a slot, block * block_size + row, times n_k or n_v, plus a column).
  void* k_at(int64_t i) { return k.get() + i * static_cast<int64_t>(dtype_size(kv_dtype)); }
  void* v_at(int64_t i) { return v.get() + i * static_cast<int64_t>(dtype_size(kv_dtype)); }
  const void* k_at(int64_t i) const { return k.get() + i * static_cast<int64_t>(dtype_size(kv_dtype)); }
  const void* v_at(int64_t i) const { return v.get() + i * static_cast<int64_t>(dtype_size(kv_dtype)); }
  // Throws InvalidArgument (naming the sizes) for an empty or impossibly large pool.
  void reset(const AttnLayerShape& s, int64_t n_blocks, int64_t block_size,
             DType kv_dtype = DType::F32);
  int64_t bytes() const;
};

// The sequences of one paged decode step: their block tables, (B, table_stride) ids, and
// lens[b], the positions sequence b holds after this step (its new token is at lens[b] - 1).
struct PagedSeqs {
  int64_t B = 0;
  const int32_t* tables = nullptr;  // (B, table_stride)
  int64_t table_stride = 0;
  const int64_t* lens = nullptr;    // (B)
};

// One decode step of B sequences of different lengths in a paged pool: inp (B, C) (already
// normalised) -> out (B, C). The projections are one product over the B rows (weights read
// once), RoPE at each sequence's own position (cos_rows/sin_rows (B, D/2)), each new K/V row
// written into its sequence's block, and one attention_paged call over all B sequences,
// reading the blocks in place. Row b equals attn_layer_fwd(B = 1, T = 1) on sequence b with a
// contiguous cache up to the order of the sums (the products; the split-KV decode's, where
// the contiguous call of a short F32 cache takes the tiled forward).
void attn_layer_decode_paged(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                             const AttnLayerWeights& w, const AttnLayerShape& s,
                             const float* cos_rows, const float* sin_rows, KVPool& pool,
                             const PagedSeqs& seqs);

// A prompt chunk of one sequence into its blocks: inp (T, C) at positions pos0 .. pos0 + T - 1
// -> out (T, C). The chunk's K/V rows are written into the sequence's blocks (table: table_len
// ids), then its T query rows attend to all pos0 + T positions read from the blocks in place
// (one attention_paged call: no gathered copy of the history).
void attn_layer_fwd_paged(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                          const AttnLayerWeights& w, const AttnLayerShape& s, int64_t T,
                          const float* cos_t, const float* sin_t, KVPool& pool,
                          const int32_t* table, int64_t table_len, int64_t pos0);

// Cross attention (SambaY's cross-decoder, arXiv:2507.06607): the layer's own queries (w.proj
// and w.proj_bias hold only the q rows) against another layer's keys and values; diff_v1 only.
// attn_layer_cross_decode_paged: the decode step of B sequences against their blocks of another
// layer's pool (seqs.lens: the keys each sees, its new token's included, written by that layer
// already).
void attn_layer_cross_decode_paged(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                                   const AttnLayerWeights& w, const AttnLayerShape& s,
                                   const KVPool& pool, const PagedSeqs& seqs);
// One sequence's T query rows (its last T of len positions, causal bottom-right) against its
// blocks of another layer's pool (table: table_len ids), read in place.
void attn_layer_cross_fwd_paged(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                                const AttnLayerWeights& w, const AttnLayerShape& s, int64_t T,
                                const KVPool& pool, const int32_t* table, int64_t table_len,
                                int64_t len);

// Sliding-window attention without positional encoding (SambaY): a query at position i sees
// the keys of positions i - W < j <= i, W = ring->capacity. A sequence's rows [row0, row0 + n)
// of the call are its positions pos0.. ; its ring (B = 1, capacity W) holds position p at slot
// p % W for the last min(len, W) positions, rows' K/V written there. One row is a decode step
// (attention over the ring as it is); several are a prompt chunk (the ring's positions and the
// chunk's gathered in order into scratch, then two attention calls).
struct WindowSeq {
  int64_t row0 = 0, n = 0, pos0 = 0;
  KVCache* ring = nullptr;
};
void attn_layer_window(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                       const AttnLayerWeights& w, const AttnLayerShape& s, int64_t N,
                       const std::vector<WindowSeq>& seqs, KVCache& scratch);

// The operator call a forward with save_stats made, rebuilt from its saved acts for looking
// inside (no cache): q and k after RoPE and v as strided views of acts.proj, lam, out = acts.att
// and lse = acts.lse, all read only (a saved forward: the type the backward reads).
kernels::AttnBwdParams attn_layer_params(const AttnLayerActs& acts, const AttnLayerShape& s, int64_t B,
                             int64_t T);

struct AttnLayerScratch {
  std::vector<float> dnormed, datt, dproj, dlam;
};

// dinp (B, T, C) += d/dinp, grads += d/dweights, from dout (B, T, C) and the saved acts.
void attn_layer_bwd(const ExecContext& ctx, float* dinp, const AttnLayerGrads& g, const float* dout,
                    const AttnLayerActs& acts, const float* inp, const AttnLayerWeights& w,
                    const AttnLayerShape& s, int64_t B, int64_t T, const float* cos_t,
                    const float* sin_t, AttnLayerScratch& scratch);

}  // namespace diffattn::nn
