// API -> params check -> backend -> kernel. Every route a call can take is in this file:
// Auto resolves to the fused CPU kernels (DIFFATTN_BACKEND=reference forces the oracle), and
// a forward with a few query rows against a long cache takes the split-KV decode path.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "diffattn/kernels/attention.h"
#include "kernels/fused.h"
#include "kernels/indexing.h"

namespace diffattn::kernels {

Backend parse_backend(const std::string& name, const std::string& where) {
  if (name == "auto") return Backend::Auto;
  if (name == "fused") return Backend::Fused;
  if (name == "reference") return Backend::Reference;
  throw InvalidArgument(where + " is \"" + name +
                        "\", expected \"auto\", \"fused\" or \"reference\"");
}

DiffMode parse_diff_mode(const std::string& name, const std::string& where) {
  if (name == "signed") return DiffMode::Signed;
  if (name == "clamp") return DiffMode::Clamp;
  throw InvalidArgument(where + " is \"" + name + "\", expected \"signed\" or \"clamp\"");
}

const char* diff_mode_name(DiffMode m) { return m == DiffMode::Clamp ? "clamp" : "signed"; }

namespace {

// DIFFATTN_BACKEND, read once: Auto means the fused kernels unless it says "reference".
Backend env_backend() {
  static const Backend b = [] {
    const char* env = std::getenv("DIFFATTN_BACKEND");
    if (env == nullptr || *env == '\0') return Backend::Fused;
    const Backend named = parse_backend(env, "DIFFATTN_BACKEND");
    return named == Backend::Auto ? Backend::Fused : named;
  }();
  return b;
}

std::atomic<uint64_t> g_forward{0}, g_backward{0}, g_decode{0}, g_paged{0};

}  // namespace

KernelCalls kernel_calls() {
  return {g_forward.load(), g_backward.load(), g_decode.load(), g_paged.load()};
}

Backend resolve_backend(Backend requested) {
  return requested != Backend::Auto ? requested : env_backend();
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Auto: return "auto";
    case Backend::Reference: return "reference";
    case Backend::Fused: return "fused";
  }
  return "?";
}

namespace {

// The decode path serves signed and standard attention; clamp needs its two passes.
bool decode_capable(const AttnParams& p) { return p.maps == 1 || p.mode == DiffMode::Signed; }

// Whether every value a causal decode with several query rows reads is finite. Its chunk
// products multiply masked-out weights (0) by V, so a NaN or Inf value would poison rows that
// never see that key; the reference (which defines the semantics: a bad value reaches exactly
// the rows that attend to it) takes such calls. The tiled forward checks the same while it
// packs V (attention_fwd_fused returns false); one-row decode needs no check. NaN and Inf in q
// and k need none either: they propagate through the scores.
bool values_finite(const AttnProblem& p, const fused::KvPages* pages = nullptr) {
  std::vector<float> row(p.kv_dtype == DType::F32 ? 0 : static_cast<size_t>(p.Dv));
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < p.Tk; ++t) {
      // row t of batch b: at the batch's strides, or (pages, B = 1) in its block
      const int64_t at =
          pages ? pages->row(t) * p.v_row_stride : b * p.v_batch_stride + t * p.v_row_stride;
      for (int64_t g = 0; g < p.G; ++g) {
        const float* x;
        if (p.kv_dtype == DType::F32) {
          x = p.vf() + at + g * p.v_head_stride;
        } else {
          convert_to_f32(row.data(), p.vh() + at + g * p.v_head_stride, p.kv_dtype, p.Dv);
          x = row.data();
        }
        float z = 0.0f;  // x * 0 is NaN exactly when x is NaN or Inf
        for (int64_t d = 0; d < p.Dv; ++d) z += x[d] * 0.0f;
        if (z != 0.0f) return false;
      }
    }
  }
  return true;
}

}  // namespace

void attention_fwd(const AttnParams& p, Backend backend) {
  const char* op = p.maps == 2 ? "diff_attention" : "attention";
  g_forward.fetch_add(1, std::memory_order_relaxed);
  if (resolve_backend(backend) == Backend::Reference) return attention_fwd_ref(p);
  check_params(p, op);
  // A 16-bit cache takes the decode path at any length: it reads 16 bits in place, where the
  // tiled forward would need a float32 copy of the whole cache per call.
  if (p.Tq <= fused::DecodeTiles::kMaxRows &&
      (p.Tk >= fused::DecodeTiles::kMinKeys || p.kv_dtype != DType::F32) && decode_capable(p)) {
    if (p.causal && p.Tq > 1 && !values_finite(p)) return attention_fwd_ref(p);
    return attention_decode_fused(AttnDecodeParams(p));
  }
  // (16-bit K/V: the tiled forward widens each tile as it packs it.)
  if (!attention_fwd_fused(p)) attention_fwd_ref(p);  // a non-finite v under a causal mask
}

void attention_decode(const AttnDecodeParams& p, Backend backend) {
  const char* op = p.maps == 2 ? "diff_attention_decode" : "attention_decode";
  g_decode.fetch_add(1, std::memory_order_relaxed);
  if (resolve_backend(backend) == Backend::Reference) return attention_fwd_ref(p);
  check_params(p, op);
  if (p.key_chunk < 0) {
    throw InvalidArgument(std::string(op) + ": key_chunk must be >= 0 (0 picks), got " +
                          std::to_string(p.key_chunk));
  }
  if (!decode_capable(p)) {
    if (!attention_fwd_fused(p)) attention_fwd_ref(p);
    return;
  }
  if (p.causal && p.Tq > 1 && !values_finite(p)) return attention_fwd_ref(p);
  attention_decode_fused(p);
}

namespace {

// Sequence b of a paged call (its n_b >= 1 rows) as one forward problem over its keys: B = 1,
// Tq = n_b, Tk = seq_lens[b], causal (bottom-right), q, lam and out at the sequence's first
// row. K/V are left for the caller: the pools with `pages` (the fused kernels read the blocks in
// place) or a gathered copy (the reference).
AttnParams sequence_problem(const PagedAttnParams& pp, int64_t b) {
  const int64_t r0 = pp.row0(b);
  AttnParams p;
  p.B = 1, p.Tq = pp.rows_of(b), p.Tk = pp.seq_lens[b], p.H = pp.H, p.G = pp.G, p.D = pp.D;
  p.Dv = pp.Dv, p.maps = pp.maps, p.shared_keys = pp.shared_keys;
  p.lam_per_token = pp.lam_per_token, p.noise_share = pp.noise_share;
  p.causal = true, p.scale = pp.scale, p.mode = DiffMode::Signed;
  p.set_contiguous_strides();
  p.q = pp.q + r0 * pp.q_row_stride;
  p.q_row_stride = pp.q_row_stride, p.q_head_stride = pp.q_head_stride;
  p.q_batch_stride = p.Tq * pp.q_row_stride;
  p.lam = pp.maps == 2 ? pp.lam + (pp.lam_per_token ? r0 * pp.H : 0) : nullptr;
  p.kv_dtype = pp.kv_dtype;
  p.out = pp.out + r0 * pp.o_row_stride;
  p.o_row_stride = pp.o_row_stride, p.o_head_stride = pp.o_head_stride;
  p.o_batch_stride = p.Tq * pp.o_row_stride;
  return p;
}

// Sequence b of a paged call by the reference over its blocks gathered into a contiguous
// (1, len, heads, dim) copy; paged_ref: every sequence so, the oracle of attention_paged.
void paged_ref_one(const PagedAttnParams& pp, int64_t b) {
  if (pp.rows_of(b) == 0) return;
  const int64_t KH = pp.key_heads(), es = static_cast<int64_t>(dtype_size(pp.kv_dtype));
  const int64_t krow = KH * pp.D, vrow = pp.G * pp.Dv, len = pp.seq_lens[b];
  const char* kp = static_cast<const char*>(pp.k_pool);
  const char* vp = static_cast<const char*>(pp.v_pool);
  std::vector<char> k(static_cast<size_t>(std::max<int64_t>(len, 1) * krow * es));
  std::vector<char> v(static_cast<size_t>(std::max<int64_t>(len, 1) * vrow * es));
  for (int64_t j = 0; j < len; ++j) {
    const int64_t blk = pp.block_tables[b * pp.table_stride + j / pp.block_size];
    const int64_t at = blk * pp.block_size + j % pp.block_size;
    std::memcpy(&k[static_cast<size_t>(j * krow * es)], kp + at * krow * es,
                static_cast<size_t>(krow * es));
    std::memcpy(&v[static_cast<size_t>(j * vrow * es)], vp + at * vrow * es,
                static_cast<size_t>(vrow * es));
  }
  AttnParams p = sequence_problem(pp, b);
  p.k = k.data();
  p.v = v.data();
  // A decode step's row (q_starts null) sees all its keys: causal with Tq = 1 is the same.
  attention_fwd_ref(p);
}

void paged_ref(const PagedAttnParams& pp) {
  for (int64_t b = 0; b < pp.B; ++b) paged_ref_one(pp, b);
}

// Sequence b's rows by the fused kernels, K/V read from the blocks: the split-KV path for a
// few rows, the tiled forward (packing each tile from the blocks) for more; the reference where
// a causal call's values hold a NaN or Inf (as attention_fwd does).
void paged_sequence_fused(const PagedAttnParams& pp, int64_t b) {
  AttnParams p = sequence_problem(pp, b);
  p.k = pp.k_pool, p.v = pp.v_pool;
  // the pools' rows: (key_heads, D) and (G, Dv)
  p.k_row_stride = pp.key_heads() * pp.D, p.k_head_stride = pp.D;
  p.v_row_stride = pp.G * pp.Dv, p.v_head_stride = pp.Dv;
  p.k_batch_stride = p.v_batch_stride = 0;
  const fused::KvPages pages{pp.block_tables + b * pp.table_stride, pp.block_size};
  if (p.Tq <= fused::DecodeTiles::kMaxRows) {
    if (p.Tq > 1 && !values_finite(p, &pages)) return paged_ref_one(pp, b);
    AttnDecodeParams d(p);
    d.key_chunk = pp.key_chunk;
    return attention_decode_fused(d, &pages);
  }
  if (!attention_fwd_fused(p, &pages)) paged_ref_one(pp, b);
}

}  // namespace

void attention_paged(const PagedAttnParams& p, Backend backend) {
  const char* op = p.maps == 2 ? "diff_attention_paged" : "attention_paged";
  g_paged.fetch_add(1, std::memory_order_relaxed);
  check_params(p, op);
  if (resolve_backend(backend) == Backend::Reference) return paged_ref(p);
  bool one_row_each = true;
  for (int64_t b = 0; b < p.B && one_row_each; ++b) one_row_each = p.rows_of(b) == 1;
  if (one_row_each) {  // decode steps: one split-KV call over every sequence
    PagedAttnParams d = p;
    d.q_starts = nullptr;
    return attention_decode_paged_fused(d);
  }
  for (int64_t b = 0; b < p.B; ++b) {
    if (p.rows_of(b) > 0) paged_sequence_fused(p, b);
  }
}

void attention_bwd(const AttnBwdParams& p, Backend backend) {
  g_backward.fetch_add(1, std::memory_order_relaxed);
  if (resolve_backend(backend) == Backend::Reference) return attention_bwd_ref(p);
  check_params(p, p.maps == 2 ? "diff_attention_backward" : "attention_backward");
  attention_bwd_fused(p);
}

}  // namespace diffattn::kernels
