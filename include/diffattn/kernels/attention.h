// The operator family: differential attention (arXiv:2410.05258, Eq. 1) in the paper's signed
// mode and the textbook's clamp-and-renormalise mode, and standard softmax attention.
// One params struct describes a call; it is filled and validated in one place
// (diff_attn_params / attn_params), then handed to a backend (reference or fused).
#pragma once

#include <cstdint>
#include <string>

#include "diffattn/base/dtype.h"
#include "diffattn/base/error.h"
#include "diffattn/base/tensor.h"

namespace diffattn::kernels {

// signed: out = A1 V - lam A2 V (the paper). clamp: weights max(A1 - lam A2, 0) renormalised
// per row, a row that clamps to all zeros stays zero (the textbook's teaching variant).
enum class DiffMode { Signed, Clamp };

// Which implementation runs a call. Auto picks the fastest available one; the environment
// variable DIFFATTN_BACKEND=reference forces the reference everywhere.
enum class Backend { Auto, Reference, Fused };

struct AttnOptions {
  bool causal = false;    // query i sees key j iff j <= i + (Tk - Tq) (bottom-right)
  float scale = 0.0f;     // 0 means 1/sqrt(D)
  DiffMode mode = DiffMode::Signed;
};

// The operators' inputs are TensorViews (base/tensor.h) of float32 on the host: data, shape and
// element strides, outermost first (PyTorch's and NumPy's order, in elements rather than bytes;
// empty strides mean row-major contiguous). The operators read the innermost dimension
// contiguously and every other one through its stride: a fused QKV buffer, a KV cache with spare
// capacity, a (B, heads, T, D) tensor transposed to (B, T, heads, D).

// One attention problem: sizes, options, the inputs and every layout. maps == 2: differential
// attention, pair h of H subtracts sub-head 2h+1's map (times lambda) from sub-head 2h's.
// maps == 1: standard softmax attention with H heads. Batches, rows and heads may be strided
// (views into a fused QKV buffer, a KV cache with spare capacity, a transposed (B, heads, T, D)
// tensor); the last dimension is contiguous. Strides are in elements; set_contiguous_strides()
// (the builders call it) sets the row-major ones. The forward (AttnParams) adds the tensors it
// writes; the backward (AttnBwdParams) reads them as const and adds its own.
struct AttnProblem {
  // ---- sizes ----
  int64_t B = 0, Tq = 0, Tk = 0;
  int64_t H = 0;               // differential pairs (maps == 2) or heads (maps == 1)
  int64_t G = 0;               // key/value heads; pair or head h reads group h / (H / G)
  int64_t D = 0;               // query/key head size
  int64_t Dv = 0;              // value head size (V1: 2D, V2 and standard: usually D)
  int maps = 2;                // 2: differential, 1: standard
  bool shared_keys = false;    // maps == 2: k has G heads read by both maps (V2) instead of 2G
  bool lam_per_token = false;  // lam is (B, Tq, H) rather than (H)
  bool lam_scalar = false;     // lam is (1): one lambda for every pair (a V1 layer's scalar of
                               //   Eq. 2); its gradient is then one sum, rounded once
  // maps == 2: runs of noise_share consecutive pairs (dividing H / G) whose map-2 query rows
  // are equal copies (grouped differential attention, Motif-2-12.7B: one noise head for 4
  // signal heads). The fused forward (signed mode) and the fused decodes compute such a map
  // once, from the run's first pair; the reference and the backward compute each pair's own,
  // the same when the copies are equal.
  int64_t noise_share = 1;
  bool causal = false;
  float scale = 0.0f;          // multiplies q.k before the softmax
  DiffMode mode = DiffMode::Signed;

  // ---- inputs ----
  const float* q = nullptr;    // (B, Tq, maps*H, D)
  // K and V in kv_dtype: float32, or 16 bits (a BF16 or F16 KV cache; every computation stays
  // float32). The forward and decode take 16 bits (the split-KV decode reads them directly, the
  // tiled forward widens each K/V tile as it packs it, the reference reads a float32 copy); the
  // backward and attention_probs refuse them. Strides are in elements of kv_dtype.
  DType kv_dtype = DType::F32;
  const void* k = nullptr;     // (B, Tk, key_heads(), D)
  const void* v = nullptr;     // (B, Tk, G, Dv)
  const float* lam = nullptr;  // (H) or (B, Tq, H); unused when maps == 1
  // k and v as float32 (kv_dtype F32) or as 16-bit words (BF16, F16): the caller knows which.
  const float* kf() const { return static_cast<const float*>(k); }
  const float* vf() const { return static_cast<const float*>(v); }
  const uint16_t* kh() const { return static_cast<const uint16_t*>(k); }
  const uint16_t* vh() const { return static_cast<const uint16_t*>(v); }
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;

  // out's layout (the backward's dout shares it)
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  int64_t q_heads() const { return maps * H; }
  int64_t key_heads() const { return (maps == 2 && !shared_keys) ? 2 * G : G; }
  int64_t group_size() const { return H / G; }
  // Last key index query row i may see (inclusive), Tk - 1 when not causal; < 0: none.
  int64_t last_key(int64_t i) const { return causal ? i + (Tk - Tq) : Tk - 1; }

  Shape q_shape() const { return {B, Tq, q_heads(), D}; }
  Shape k_shape() const { return {B, Tk, key_heads(), D}; }
  Shape v_shape() const { return {B, Tk, G, Dv}; }
  Shape lam_shape() const {
    return lam_per_token ? Shape{B, Tq, H} : lam_scalar ? Shape{1} : Shape{H};
  }
  Shape out_shape() const { return {B, Tq, H, Dv}; }
  Shape lse_shape() const { return {B, q_heads(), Tq}; }
  int64_t numel(const Shape& s) const;

  // Row-major contiguous strides for every tensor (what the *_params builders set).
  void set_contiguous_strides();
};

// A forward: the problem and what it writes.
struct AttnParams : AttnProblem {
  float* out = nullptr;  // (B, Tq, H, Dv), strided by o_*_stride
  // Saved statistics, written when non-null and read by the backward:
  float* lse = nullptr;  // (B, maps*H, Tq) natural-log sum of exp(scale*q.k) per map;
                         //   +inf for a row that sees no key
  float* o2 = nullptr;   // (B, Tq, H, Dv) contiguous: map 2's output A2 V (maps == 2,
                         //   signed); out + lam*o2 recovers map 1's, dlam = -dout.o2
};

// The backward reads the forward's inputs, out, lse and (maps == 2) o2, plus dout, and writes
// dq, dk, dv and dlam (overwritten, not accumulated). Gradients use their input's strides:
// dq q's, dk k's, dv v's; dout uses out's; dlam is contiguous with lam's shape.
struct AttnBwdParams : AttnProblem {
  const float* out = nullptr;   // the forward's outputs, read only
  const float* lse = nullptr;
  const float* o2 = nullptr;
  const float* dout = nullptr;  // (B, Tq, H, Dv)
  float* dq = nullptr;          // like q
  float* dk = nullptr;          // like k
  float* dv = nullptr;          // like v
  float* dlam = nullptr;        // like lam (maps == 2)

  AttnBwdParams() = default;
  explicit AttnBwdParams(const AttnParams& fwd)
      : AttnProblem(fwd), out(fwd.out), lse(fwd.lse), o2(fwd.o2) {}
};

// Decode: a few query rows (Tq small, e.g. the newest token) against a long key/value cache.
// The same fields as a forward; the cache is split into chunks of keys processed in parallel,
// whose partial (max, sum, output) states are merged exactly. k and v are usually strided
// views of a cache with spare capacity (batch stride > Tk * row stride).
struct AttnDecodeParams : AttnParams {
  int64_t key_chunk = 0;  // keys per split; 0 picks from Tk and the thread count

  AttnDecodeParams() = default;
  explicit AttnDecodeParams(const AttnParams& fwd) : AttnParams(fwd) {}
};

// Paged attention: B sequences of different lengths, each with its newest query rows (one for a
// decode step, many for a prompt chunk), against K/V kept in fixed-size blocks of one pool (a
// serving engine's KV memory). Key j of sequence b is row j % block_size of block
// block_tables[b * table_stride + j / block_size]; sequence b holds seq_lens[b] keys, and its
// n_b query rows are its last n_b positions: row i (0 <= i < n_b) sees keys
// [0, seq_lens[b] - n_b + i] (causal, bottom-right: each row's own key is written already).
// The blocks of a sequence need not be contiguous or in order; the kernels read them in place
// (no gather copy). Signed differential attention (V1: separate keys, V2: shared keys and lambda
// per token) and standard attention; out is written, no lse or o2.
struct PagedAttnParams {
  // ---- sizes ----
  int64_t B = 0;               // sequences
  int64_t H = 0, G = 0;        // pairs (maps == 2) or heads (maps == 1); key/value heads
  int64_t D = 0, Dv = 0;       // query/key and value head sizes
  int maps = 2;
  bool shared_keys = false;    // maps == 2: G key heads read by both maps (V2) instead of 2G
  bool lam_per_token = false;  // lam is (rows, H) rather than (H)
  int64_t noise_share = 1;     // as AttnProblem::noise_share (maps == 2)
  float scale = 0.0f;          // multiplies q.k; must be set (no default from D here)
  int64_t n_blocks = 0;        // blocks in the pool
  int64_t block_size = 0;      // positions per block
  int64_t table_stride = 0;    // entries per row of block_tables (the longest table)

  // ---- inputs ----
  // The query rows of every sequence, in sequence order: sequence b's are rows
  // q_starts[b] .. q_starts[b + 1] - 1 (q_starts: (B + 1), from 0, non-decreasing). Null: one
  // row per sequence (a decode step; row b is sequence b's).
  const int64_t* q_starts = nullptr;
  const float* q = nullptr;    // (rows, maps*H, D), strided by q_row_stride, q_head_stride
  const float* lam = nullptr;  // (H) or (rows, H); unused when maps == 1
  DType kv_dtype = DType::F32;
  const void* k_pool = nullptr;  // (n_blocks, block_size, key_heads(), D) in kv_dtype
  const void* v_pool = nullptr;  // (n_blocks, block_size, G, Dv) in kv_dtype
  const int32_t* block_tables = nullptr;  // (B, table_stride): pool block ids
  const int64_t* seq_lens = nullptr;      // (B): keys each sequence holds, its rows' included:
                                          //   n_b..table_stride*block_size
  // Element strides of q and out (the last dimension is contiguous); set_contiguous_strides()
  // sets the row-major ones (maps*H*D, D) and (H*Dv, Dv).
  int64_t q_row_stride = 0, q_head_stride = 0;
  int64_t o_row_stride = 0, o_head_stride = 0;

  float* out = nullptr;        // (rows, H, Dv)
  int64_t key_chunk = 0;       // keys per split of the split-KV path; 0 picks from the lengths
                               //   and the thread count

  int64_t key_heads() const { return (maps == 2 && !shared_keys) ? 2 * G : G; }
  int64_t group_size() const { return H / G; }
  int64_t rows() const { return q_starts ? q_starts[B] : B; }
  int64_t row0(int64_t b) const { return q_starts ? q_starts[b] : b; }
  int64_t rows_of(int64_t b) const { return q_starts ? q_starts[b + 1] - q_starts[b] : 1; }
  void set_contiguous_strides() {
    q_head_stride = D, q_row_stride = maps * H * D;
    o_head_stride = Dv, o_row_stride = H * Dv;
  }
};

// Build and validate the params of differential attention from the caller's tensors, strides
// included (the views' strides become the params' batch, row and head strides; the last
// dimension must be contiguous). The key layout is told by k's head count: 2G (separate keys,
// V1) or G (shared, V2), G being v's head count. Throws InvalidArgument naming the tensor, the
// expected and the actual shape or stride. Checks shapes only: no tensor data is read (see
// check_lambda). Output pointers are left null with contiguous strides: allocate out_shape()
// (and lse_shape(), out_shape() for o2), or set o_*_stride for a strided out.
AttnParams diff_attn_params(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& lam, const AttnOptions& opts);

// The same for standard softmax attention (opts.mode is ignored).
AttnParams attn_params(const TensorView& q, const TensorView& k, const TensorView& v,
                       const AttnOptions& opts);

// Checks a filled params struct before a kernel reads it: sizes, strides, pointers, and that
// no output overlaps itself. O(1): reads no tensor data (a CUDA backend's lambda lives on the
// device). Every entry point calls it; callers that fill params by hand may call it too.
void check_params(const AttnProblem& p, const char* op);  // the problem only (readers)
void check_params(const AttnParams& p, const char* op);
void check_params(const AttnBwdParams& p, const char* op);
// Reads lambda (on the host) and throws naming the first non-finite entry. The Python and
// command-line surfaces call it on user input; the model's hot path skips it (a NaN lambda
// there gives NaN outputs, which the kernels propagate).
void check_lambda(const AttnProblem& p, const char* op);

// How many calls each entry point has run in this process (forward includes the calls that
// took the decode path by themselves): a way to show that a backward given the saved
// statistics runs no forward.
struct KernelCalls {
  uint64_t forward = 0, backward = 0, decode = 0, paged = 0;
};
KernelCalls kernel_calls();

// Forward: out (and lse, o2 when non-null) from q, k, v, lam.
void attention_fwd(const AttnParams& p, Backend backend = Backend::Auto);
// Backward of signed differential attention or standard attention (clamp mode has none).
void attention_bwd(const AttnBwdParams& p, Backend backend = Backend::Auto);
// Forward by the split-KV decode path. attention_fwd takes it by itself for at most 4 query
// rows against at least 256 keys; this entry point takes it for any shape. Clamp mode (two
// passes) runs the tiled forward instead.
void attention_decode(const AttnDecodeParams& p, Backend backend = Backend::Auto);
// Paged attention over B sequences in one call, every K/V row read from its block in place.
// A call of one row per sequence (a decode step) is the split-KV decode parallel over
// (sequence, key-head group, key split); its arithmetic for a sequence is attention_decode's on
// the same keys with the same key_chunk whenever block_size is a multiple of 16 (bit for bit),
// otherwise its P V sums split at block ends (float32 rounding). A sequence with several rows
// runs as attention_fwd would on its keys gathered (causal, bottom-right): the split-KV path for
// at most 4 rows, the tiled forward (which packs each K/V tile straight from the blocks, a 16-bit
// pool widened as it packs) for more. Backend::Reference gathers each sequence and runs the
// reference (the oracle).
void attention_paged(const PagedAttnParams& p, Backend backend = Backend::Auto);
// Checks a paged call's params: sizes, strides, pointers, q_starts, every sequence's length
// against its rows and its table, and every block id it uses against the pool (reads q_starts,
// block_tables and seq_lens, not q, K, V or lambda). attention_paged calls it;
// InvalidArgument names the field.
void check_params(const PagedAttnParams& p, const char* op);

// The fused kernels written by Highway for several instruction sets, chosen at run time on
// the first call: the name of the one this CPU runs ("AVX3" = AVX-512, "AVX2", "EMU128", ...).
const char* fused_simd_target();

// The reference (oracle): plain loops, double accumulation. The reference backend's backward
// (attention_bwd_ref, Backend::Reference) honours the saved lse as the fused one does: its
// maps are exp(scale q.k - lse). attention_bwd_oracle recomputes the maps from q and k instead
// and trusts neither lse nor o2: the tests compare every backward against it, which also checks
// what the forward saved.
void attention_fwd_ref(const AttnParams& p);
void attention_bwd_ref(const AttnBwdParams& p);
void attention_bwd_oracle(const AttnBwdParams& p);

// The attention probabilities of map `map` (0, or 1 when maps == 2) for every head, recomputed
// from the scores and the saved lse as the backward does: probs (B, H, Tq, Tk); masked entries
// are 0. Needs lse from a forward. For looking inside: the fast paths never store this.
void attention_probs(const AttnProblem& p, const float* lse, int map, float* probs);
inline void attention_probs(const AttnParams& p, int map, float* probs) {
  attention_probs(p, p.lse, map, probs);
}
// A saved forward (out and lse read only), e.g. TrainContext::layer_attention's.
inline void attention_probs(const AttnBwdParams& p, int map, float* probs) {
  attention_probs(p, p.lse, map, probs);
}

// The backend Auto resolves to: the environment variable DIFFATTN_BACKEND may force
// "reference". The variable is read once, on the first call, and kept for the process.
Backend resolve_backend(Backend requested);
// Parses "auto", "fused" or "reference" (the one parser of backend names); throws naming
// `where` otherwise.
Backend parse_backend(const std::string& name, const std::string& where);
// Parses "signed" or "clamp" (the one parser of mode names, for the CLI, the explorer and
// Python); throws InvalidArgument "<where> is "x", expected "signed" or "clamp"".
DiffMode parse_diff_mode(const std::string& name, const std::string& where);
const char* diff_mode_name(DiffMode m);
const char* backend_name(Backend b);

// FLOPs of one forward, counted as FlashAttention does: 2 per multiply-add of every QK^T and
// PV product over the (query, key) pairs that causality leaves visible.
double attention_fwd_flops(const AttnProblem& p);
// Number of (query, key) pairs visible in one (batch, head) slice.
double visible_pairs(const AttnProblem& p);

}  // namespace diffattn::kernels

namespace diffattn::kernels {

// The differential weights of one row from its two maps: a1 - lam*a2 (signed), or that clamped
// at zero and renormalised to sum to 1 (clamp; a row that clamps to all zeros stays zero).
void diff_row_weights(const float* a1, const float* a2, float lam, DiffMode mode, int64_t n,
                      float* w);

}  // namespace diffattn::kernels
