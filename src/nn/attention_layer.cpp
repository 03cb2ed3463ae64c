// The attention layers (V1, V2, standard) over the kernel API. The stacked projection writes
// q | k | v | lambda logits into one (B, T, n_proj) buffer; the operator reads q, k and v
// from it through row strides, and writes its gradients back into the same layout, so one
// sgemm serves the forward and two the backward.
#include "diffattn/nn/attention_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "diffattn/nn/layers.h"

namespace diffattn::nn {

const char* attn_kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::DiffV1: return "diff_v1";
    case AttnKind::DiffV2: return "diff_v2";
    case AttnKind::Standard: return "standard";
  }
  return "?";
}

void KVCache::reset(const AttnLayerShape& s, int64_t batch, int64_t cap, DType dtype) {
  B = batch;
  capacity = cap;
  len = 0;
  n_k = s.n_k();
  n_v = s.n_v();
  kv_dtype = dtype;
  const size_t es = dtype_size(dtype);
  k.assign(static_cast<size_t>(B * cap * n_k) * es, 0);
  v.assign(static_cast<size_t>(B * cap * n_v) * es, 0);
}

void KVPool::reset(const AttnLayerShape& s, int64_t blocks, int64_t bsize, DType dtype) {
  if (blocks < 1 || bsize < 1 || blocks > (int64_t{1} << 31) / bsize) {
    throw InvalidArgument("KV pool: " + std::to_string(blocks) + " blocks of " +
                          std::to_string(bsize) +
                          " positions; both must be >= 1 and their product below 2^31");
  }
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) {
    throw InvalidArgument("KV pool: the KV dtype must be f32, bf16 or f16");
  }
  n_blocks = blocks;
  block_size = bsize;
  n_k = s.n_k();
  n_v = s.n_v();
  kv_dtype = dtype;
  const size_t es = dtype_size(dtype);
  // No value-initialisation: the pool's pages stay untouched until written.
  k = new_page_array<uint8_t>(static_cast<size_t>(blocks * bsize * n_k) * es);
  v = new_page_array<uint8_t, kValuePageOffset>(static_cast<size_t>(blocks * bsize * n_v) * es);
}

int64_t KVPool::bytes() const {
  return n_blocks * block_size * (n_k + n_v) * static_cast<int64_t>(dtype_size(kv_dtype));
}

double v1_lambda(const AttnLayerWeights& w, const AttnLayerShape& s, double* e1, double* e2) {
  double d1 = 0, d2 = 0;
  for (int64_t i = 0; i < s.D; ++i) {
    d1 += static_cast<double>(w.lambda_q1[i]) * w.lambda_k1[i];
    d2 += static_cast<double>(w.lambda_q2[i]) * w.lambda_k2[i];
  }
  // arXiv:2410.05258 Eq. 2: lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init
  const double x1 = std::exp(d1), x2 = std::exp(d2);
  if (e1) *e1 = x1;
  if (e2) *e2 = x2;
  return x1 - x2 + s.lambda_init;
}

namespace {

// The operator's params for q from `proj` (B, Tq rows, stride n_proj) and k, v either from
// `proj` too or from a cache (Tk rows, batch stride capacity rows).
kernels::AttnParams make_params(const AttnLayerShape& s, int64_t B, int64_t Tq, const float* proj,
                       const float* lam, const KVCache* cache, int64_t k0 = 0) {
  const int64_t np = s.n_proj();
  const int64_t Tk = cache ? cache->len : Tq;
  const float* q = proj;
  // k and v: columns of the projection, or the cache's rows from k0 on in its type.
  const DType kt = cache ? cache->kv_dtype : DType::F32;
  const void* k = cache ? cache->k_at(k0 * s.n_k()) : static_cast<const void*>(proj + s.n_q());
  const void* v =
      cache ? cache->v_at(k0 * s.n_v()) : static_cast<const void*>(proj + s.n_q() + s.n_k());
  kernels::AttnOptions opts;
  opts.causal = true;
  // q is a column block of the (B, T, n_proj) projection; k and v are too, or rows of the
  // cache, whose batches are `capacity` positions apart.
  const int64_t krow = cache ? s.n_k() : np, vrow = cache ? s.n_v() : np;
  const int64_t kcap = cache ? cache->capacity : Tq;
  const TensorView qv = TensorView(q, {B, Tq, s.q_heads(), s.D}, {Tq * np, np, s.D, 1});
  const TensorView kv(k, kt, {B, Tk, s.k_heads(), s.D}, {kcap * krow, krow, s.D, 1});
  const TensorView vv(v, kt, {B, Tk, s.G, s.Dv()}, {kcap * vrow, vrow, s.Dv(), 1});
  kernels::AttnParams p;
  if (s.kind == AttnKind::Standard) {
    p = kernels::attn_params(qv, kv, vv, opts);
  } else {
    // V1: the layer's one lambda (acts.lam holds it per pair for the paged decode; the
    // operator reads its first entry, and its gradient is one sum)
    const Shape lam_shape = s.kind == AttnKind::DiffV1 ? Shape{1} : Shape{B, Tq, s.H};
    p = kernels::diff_attn_params(qv, kv, vv, {lam, lam_shape}, opts);
  }
  p.noise_share = s.noise_share;
  return p;
}

// The k and v columns of a projection row into one cache position (k: n_k, v: n_v elements of
// dt), rounded once to the cache's type when it is 16-bit.
void store_kv(DType dt, void* k, void* v, const AttnLayerShape& s, const float* row) {
  if (dt == DType::F32) {
    std::memcpy(k, row + s.n_q(), sizeof(float) * static_cast<size_t>(s.n_k()));
    std::memcpy(v, row + s.n_q() + s.n_k(), sizeof(float) * static_cast<size_t>(s.n_v()));
  } else {
    convert_from_f32(static_cast<uint16_t*>(k), row + s.n_q(), dt, s.n_k());
    convert_from_f32(static_cast<uint16_t*>(v), row + s.n_q() + s.n_k(), dt, s.n_v());
  }
}

// Position `at` (batch * capacity + t) of the cache gets the k and v columns of a projection row.
void append_kv(KVCache& c, const AttnLayerShape& s, int64_t at, const float* row) {
  store_kv(c.kv_dtype, c.k_at(at * s.n_k()), c.v_at(at * s.n_v()), s, row);
}

// Position pos of a sequence with block table `table` gets the k and v columns of a row.
void append_kv(KVPool& pool, const AttnLayerShape& s, const int32_t* table, int64_t pos,
               const float* row) {
  const int64_t at = static_cast<int64_t>(table[pos / pool.block_size]) * pool.block_size +
                     pos % pool.block_size;
  store_kv(pool.kv_dtype, pool.k_at(at * s.n_k()), pool.v_at(at * s.n_v()), s, row);
}

// A pool made for this layer's shape, and a sequence's positions [0, len) inside its table of
// table_len ids of the pool: else InvalidArgument naming the sequence (before any write).
void check_pool(const KVPool& pool, const AttnLayerShape& s) {
  if (pool.n_k != s.n_k() || pool.n_v != s.n_v() || pool.n_blocks < 1) {
    throw InvalidArgument("attention layer: the KV pool was made for another layer shape (" +
                          std::to_string(pool.n_k) + " + " + std::to_string(pool.n_v) +
                          " floats a position, this layer has " + std::to_string(s.n_k()) +
                          " + " + std::to_string(s.n_v()) + ")");
  }
}
void check_table(const KVPool& pool, const int32_t* table, int64_t table_len, int64_t len,
                 int64_t seq) {
  const std::string who = "attention layer: sequence " + std::to_string(seq);
  if (len < 1 || table == nullptr || len > table_len * pool.block_size) {
    throw InvalidArgument(who + " has " + std::to_string(len) + " positions, its block table " +
                          std::to_string(table_len) + " blocks of " +
                          std::to_string(pool.block_size));
  }
  for (int64_t i = 0; i < (len + pool.block_size - 1) / pool.block_size; ++i) {
    if (table[i] < 0 || table[i] >= pool.n_blocks) {
      throw InvalidArgument(who + ": block table entry " + std::to_string(i) + " = " +
                            std::to_string(table[i]) + " is outside the pool of " +
                            std::to_string(pool.n_blocks) + " blocks");
    }
  }
}

// check_pool, and check_table for each of a decode step's sequences.
void check_pool_and_tables(const KVPool& pool, const AttnLayerShape& s, const PagedSeqs& seqs) {
  check_pool(pool, s);
  for (int64_t b = 0; b < seqs.B; ++b) {
    check_table(pool, seqs.tables + b * seqs.table_stride, seqs.table_stride, seqs.lens[b], b);
  }
}

// acts.att (rows, n_out) = one attention_paged call over the sequences: their query rows q
// (ldq apart; q_starts null: one row per sequence, else as PagedAttnParams::q_starts), lambda
// from acts.lam, keys and values read in the pool's blocks.
void paged_attention(const ExecContext& ctx, AttnLayerActs& acts, const AttnLayerShape& s, const KVPool& pool,
                     const PagedSeqs& seqs, const float* q, int64_t ldq,
                     const int64_t* q_starts = nullptr) {
  kernels::PagedAttnParams p;
  p.B = seqs.B, p.H = s.H, p.G = s.G, p.D = s.D, p.Dv = s.Dv(), p.maps = s.maps();
  p.shared_keys = s.kind == AttnKind::DiffV2;
  p.lam_per_token = s.kind == AttnKind::DiffV2;
  p.noise_share = s.noise_share;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  p.n_blocks = pool.n_blocks, p.block_size = pool.block_size, p.table_stride = seqs.table_stride;
  p.q_starts = q_starts;
  p.q = q;
  p.lam = s.maps() == 2 ? acts.lam.data() : nullptr;
  p.kv_dtype = pool.kv_dtype;
  p.k_pool = pool.k.get(), p.v_pool = pool.v.get();
  p.block_tables = seqs.tables;
  p.seq_lens = seqs.lens;
  p.set_contiguous_strides();
  p.q_row_stride = ldq;
  acts.att.resize(static_cast<size_t>(p.rows() * s.n_out()));
  p.out = acts.att.data();
  ctx.paged_attention(p);
}

// acts.proj (N, n_proj) = the stacked projection of inp (N rows) plus its biases, and acts.lam:
// V1 the layer's lambda (Eq. 2) broadcast to the pairs, V2 sigmoid(lambda_proj x) per row and
// pair. Returns acts.proj's data (RoPE not applied yet).
float* project(const ExecContext& ctx, AttnLayerActs& acts, const float* inp, const AttnLayerWeights& w,
               const AttnLayerShape& s, int64_t N) {
  const int64_t np = s.n_proj();
  acts.proj.resize(static_cast<size_t>(N * np));
  float* proj = acts.proj.data();
  ctx.linear(proj, inp, w.proj, N, s.C, np);
  if (w.proj_bias) bias_add(proj, w.proj_bias, N, s.n_q() + s.n_k() + s.n_v(), np);
  if (s.kind == AttnKind::DiffV1) {
    acts.lambda = v1_lambda(w, s, &acts.e1, &acts.e2);
    acts.lam.assign(static_cast<size_t>(s.H), static_cast<float>(acts.lambda));
  } else if (s.kind == AttnKind::DiffV2) {
    // lambda[t, h] = sigmoid(lambda_proj x)[t, h], one per token and pair
    acts.lam.resize(static_cast<size_t>(N * s.H));
    sigmoid_fwd(acts.lam.data(), proj + s.n_q() + s.n_k() + s.n_v(), N, s.H, np);
  }
  return proj;
}

// acts.proj (N, n_q) = the query projection of inp plus its bias (a cross-attention layer's
// weight has only the q rows), and acts.lam the layer's lambda (V1 only).
float* project_q(const ExecContext& ctx, AttnLayerActs& acts, const float* inp, const AttnLayerWeights& w,
                 const AttnLayerShape& s, int64_t N) {
  acts.proj.resize(static_cast<size_t>(N * s.n_q()));
  float* proj = acts.proj.data();
  ctx.linear(proj, inp, w.proj, N, s.C, s.n_q());
  if (w.proj_bias) bias_add(proj, w.proj_bias, N, s.n_q());
  acts.lambda = v1_lambda(w, s, &acts.e1, &acts.e2);
  acts.lam.assign(static_cast<size_t>(s.H), static_cast<float>(acts.lambda));
  return proj;
}

// out (N, C) = out_proj of the operator's output acts.att (N rows), V1's per-head norm first.
void output(const ExecContext& ctx, float* out, AttnLayerActs& acts, const AttnLayerWeights& w, const AttnLayerShape& s,
            int64_t N) {
  const float* src = acts.att.data();
  if (s.kind == AttnKind::DiffV1) {
    // Eq. 3: head_i = (1 - lambda_init) * RMSNorm(head_i), one subln weight for every pair
    acts.normed.resize(acts.att.size());
    acts.sub_rstd.resize(static_cast<size_t>(N * s.H));
    ctx.rmsnorm(acts.normed.data(), acts.sub_rstd.data(), acts.att.data(), w.subln, N * s.H,
                s.Dv(), s.eps);
    const float mult = 1.0f - s.lambda_init;
    for (float& x : acts.normed) x *= mult;
    src = acts.normed.data();
  }
  ctx.linear(out, src, w.out_proj, N, s.n_out(), s.C);
  if (w.out_bias) bias_add(out, w.out_bias, N, s.C);
}

}  // namespace

void attn_layer_fwd(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                    const AttnLayerWeights& w, const AttnLayerShape& s, int64_t B, int64_t T,
                    const float* cos_t, const float* sin_t, bool save_stats) {
  const int64_t BT = B * T, np = s.n_proj();
  float* proj = project(ctx, acts, inp, w, s, BT);
  if (cos_t) {  // null tables: a model without positional encoding (SambaY)
    ctx.rope(proj, cos_t, sin_t, B, T, s.q_heads(), s.D, np, T * np, false);
    ctx.rope(proj + s.n_q(), cos_t, sin_t, B, T, s.k_heads(), s.D, np, T * np, false);
  }
  kernels::AttnParams p = make_params(s, B, T, proj, acts.lam.data(), nullptr);
  acts.att.resize(static_cast<size_t>(BT * s.n_out()));
  p.out = acts.att.data();
  if (save_stats) {
    acts.lse.resize(static_cast<size_t>(B * s.q_heads() * T));
    p.lse = acts.lse.data();
    if (s.maps() == 2) {
      acts.o2.resize(acts.att.size());
      p.o2 = acts.o2.data();
    }
  }
  ctx.attention(p);
  output(ctx, out, acts, w, s, BT);
}

void attn_layer_decode_paged(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                             const AttnLayerWeights& w, const AttnLayerShape& s,
                             const float* cos_rows, const float* sin_rows, KVPool& pool,
                             const PagedSeqs& seqs) {
  const int64_t B = seqs.B, np = s.n_proj(), half = s.D / 2;
  check_pool_and_tables(pool, s, seqs);
  float* proj = project(ctx, acts, inp, w, s, B);
  for (int64_t b = 0; b < B; ++b) {
    float* row = proj + b * np;
    if (cos_rows) {
      ctx.rope(row, cos_rows + b * half, sin_rows + b * half, 1, 1, s.q_heads(), s.D, np, np, false);
      ctx.rope(row + s.n_q(), cos_rows + b * half, sin_rows + b * half, 1, 1, s.k_heads(), s.D, np,
                 np, false);
    }
    append_kv(pool, s, seqs.tables + b * seqs.table_stride, seqs.lens[b] - 1, row);
  }
  // One call over the B sequences: q rows of the projection (stride n_proj), the pool's blocks.
  paged_attention(ctx, acts, s, pool, seqs, proj, np);
  output(ctx, out, acts, w, s, B);
}

void attn_layer_fwd_paged(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                          const AttnLayerWeights& w, const AttnLayerShape& s, int64_t T,
                          const float* cos_t, const float* sin_t, KVPool& pool,
                          const int32_t* table, int64_t table_len, int64_t pos0) {
  check_pool(pool, s);
  check_table(pool, table, table_len, pos0 + T, 0);
  const int64_t np = s.n_proj();
  float* proj = project(ctx, acts, inp, w, s, T);
  if (cos_t) {  // null tables: a model without positional encoding (SambaY)
    ctx.rope(proj, cos_t, sin_t, 1, T, s.q_heads(), s.D, np, T * np, false);
    ctx.rope(proj + s.n_q(), cos_t, sin_t, 1, T, s.k_heads(), s.D, np, T * np, false);
  }
  // The chunk's K/V rows into the sequence's blocks, then its T rows against all pos0 + T keys
  // read from the blocks in place.
  for (int64_t t = 0; t < T; ++t) append_kv(pool, s, table, pos0 + t, proj + t * np);
  const int64_t len = pos0 + T, starts[2] = {0, T};
  paged_attention(ctx, acts, s, pool, PagedSeqs{1, table, table_len, &len}, proj, np, starts);
  output(ctx, out, acts, w, s, T);
}

void attn_layer_cross_decode_paged(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                                   const AttnLayerWeights& w, const AttnLayerShape& s,
                                   const KVPool& pool, const PagedSeqs& seqs) {
  check_pool_and_tables(pool, s, seqs);
  const float* q = project_q(ctx, acts, inp, w, s, seqs.B);
  paged_attention(ctx, acts, s, pool, seqs, q, s.n_q());
  output(ctx, out, acts, w, s, seqs.B);
}

void attn_layer_cross_fwd_paged(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                                const AttnLayerWeights& w, const AttnLayerShape& s, int64_t T,
                                const KVPool& pool, const int32_t* table, int64_t table_len,
                                int64_t len) {
  if (s.kind != AttnKind::DiffV1 || len < T) {
    throw InvalidArgument("cross attention: a diff_v1 layer over one sequence's " +
                          std::to_string(len) + " keys for " + std::to_string(T) + " queries");
  }
  check_pool(pool, s);
  check_table(pool, table, table_len, len, 0);
  const float* q = project_q(ctx, acts, inp, w, s, T);
  const int64_t starts[2] = {0, T};
  paged_attention(ctx, acts, s, pool, PagedSeqs{1, table, table_len, &len}, q, s.n_q(), starts);
  output(ctx, out, acts, w, s, T);
}

void attn_layer_window(const ExecContext& ctx, float* out, AttnLayerActs& acts, const float* inp,
                       const AttnLayerWeights& w, const AttnLayerShape& s, int64_t N,
                       const std::vector<WindowSeq>& seqs, KVCache& scratch) {
  const int64_t np = s.n_proj();
  float* proj = project(ctx, acts, inp, w, s, N);
  acts.att.resize(static_cast<size_t>(N * s.n_out()));
  for (const WindowSeq& q : seqs) {
    KVCache& ring = *q.ring;
    const int64_t W = ring.capacity;
    if (ring.B != 1 || W < 1 || q.n < 1 || q.pos0 < 0 || q.row0 < 0 || q.row0 + q.n > N) {
      throw InvalidArgument("window attention: a ring of one sequence and rows inside the call");
    }
    const float* rows = proj + q.row0 * np;
    float* att = acts.att.data() + q.row0 * s.n_out();
    if (q.n == 1) {  // a decode step: the ring's keys, in any order, are the window
      append_kv(ring, s, q.pos0 % W, rows);
      ring.len = std::min(q.pos0 + 1, W);
      kernels::AttnParams p = make_params(s, 1, 1, rows, acts.lam.data(), &ring);
      p.out = att;
      ctx.attention(p);
      continue;
    }
    // A chunk: the window's cached positions [s0, pos0) in order, then the chunk's, contiguous.
    const int64_t s0 = std::max<int64_t>(0, q.pos0 - W + 1), prior = q.pos0 - s0;
    const int64_t len = prior + q.n;
    if (scratch.B != 1 || scratch.capacity < len || scratch.kv_dtype != ring.kv_dtype ||
        scratch.n_k != s.n_k() || scratch.n_v != s.n_v()) {
      scratch.reset(s, 1, std::max<int64_t>(len, 2 * W), ring.kv_dtype);
    }
    for (int64_t j = 0; j < prior; ++j) {
      const int64_t slot = (s0 + j) % W;
      const size_t es = dtype_size(ring.kv_dtype);
      std::memcpy(scratch.k_at(j * s.n_k()), ring.k_at(slot * s.n_k()), es * static_cast<size_t>(s.n_k()));
      std::memcpy(scratch.v_at(j * s.n_v()), ring.v_at(slot * s.n_v()), es * static_cast<size_t>(s.n_v()));
    }
    for (int64_t t = 0; t < q.n; ++t) append_kv(scratch, s, prior + t, rows + t * np);
    // Rows whose window starts at or before the copy's first position see all of it up to
    // themselves (causal, bottom-right): position i = pos0 + t with i - W + 1 <= s0.
    const int64_t nA = std::min(q.n, s0 + W - q.pos0);
    scratch.len = prior + nA;
    kernels::AttnParams pa = make_params(s, 1, nA, rows, acts.lam.data(), &scratch);
    pa.out = att;
    ctx.attention(pa);
    // The rest see exactly W keys ending at themselves: one call, a batch of one-row queries
    // whose keys start one position apart (inputs may overlap).
    const int64_t nB = q.n - nA;
    if (nB > 0) {
      scratch.len = W;
      kernels::AttnParams pb = make_params(s, 1, 1, rows + nA * np, acts.lam.data(), &scratch,
                                  prior + nA - W + 1);
      pb.B = nB;
      pb.q_batch_stride = np;
      pb.k_batch_stride = s.n_k();
      pb.v_batch_stride = s.n_v();
      pb.o_batch_stride = s.n_out();
      pb.out = att + nA * s.n_out();
      ctx.attention(pb);
    }
    // The chunk's last min(n, W) positions into the ring.
    for (int64_t t = std::max<int64_t>(0, q.n - W); t < q.n; ++t) {
      append_kv(ring, s, (q.pos0 + t) % W, rows + t * np);
    }
    ring.len = std::min(q.pos0 + q.n, W);
  }
  output(ctx, out, acts, w, s, N);
}

kernels::AttnBwdParams attn_layer_params(const AttnLayerActs& acts, const AttnLayerShape& s, int64_t B,
                             int64_t T) {
  const int64_t BT = B * T;
  if (static_cast<int64_t>(acts.proj.size()) != BT * s.n_proj() ||
      static_cast<int64_t>(acts.lse.size()) != B * s.q_heads() * T ||
      static_cast<int64_t>(acts.att.size()) != BT * s.n_out()) {
    throw InvalidArgument("attention layer: no saved statistics of a forward over (B, T) = (" +
                          std::to_string(B) + ", " + std::to_string(T) + ")");
  }
  kernels::AttnBwdParams p(make_params(s, B, T, acts.proj.data(), acts.lam.data(), nullptr));
  p.out = acts.att.data();
  p.lse = acts.lse.data();
  return p;
}

void attn_layer_bwd(const ExecContext& ctx, float* dinp, const AttnLayerGrads& g, const float* dout,
                    const AttnLayerActs& acts, const float* inp, const AttnLayerWeights& w,
                    const AttnLayerShape& s, int64_t B, int64_t T, const float* cos_t,
                    const float* sin_t, AttnLayerScratch& sc) {
  const int64_t BT = B * T, np = s.n_proj(), Dv = s.Dv(), no = s.n_out();
  const bool v1 = s.kind == AttnKind::DiffV1;

  // out = out_proj(src)
  sc.dnormed.resize(static_cast<size_t>(BT * no));
  const float* src = v1 ? acts.normed.data() : acts.att.data();
  if (w.proj_bias || w.out_bias) {
    throw InvalidArgument("attention layer: projection biases are for inference only; the backward refuses them");
  }
  ctx.linear_backward(sc.dnormed.data(), g.out_proj, dout, src, w.out_proj.f32(), BT, no, s.C, 0, true);

  const float* datt = sc.dnormed.data();
  if (v1) {
    // normed = (1 - lambda_init) * rmsnorm(att, subln)
    const float mult = 1.0f - s.lambda_init;
    for (float& x : sc.dnormed) x *= mult;
    sc.datt.assign(sc.dnormed.size(), 0.0f);
    ctx.rmsnorm_backward(sc.datt.data(), g.subln, sc.dnormed.data(), acts.att.data(), w.subln,
                         acts.sub_rstd.data(), BT * s.H, Dv);
    datt = sc.datt.data();
  }

  // The operator overwrites the q, k and v columns; only V2's lambda columns accumulate.
  sc.dproj.resize(static_cast<size_t>(BT * np));
  float* dproj = sc.dproj.data();
  if (s.n_lam() > 0) {
    for (int64_t i = 0; i < BT; ++i) {
      std::fill_n(dproj + i * np + (np - s.n_lam()), s.n_lam(), 0.0f);
    }
  }
  kernels::AttnBwdParams bp(make_params(s, B, T, acts.proj.data(), acts.lam.data(), nullptr));
  bp.out = acts.att.data();
  bp.lse = acts.lse.data();
  bp.o2 = s.maps() == 2 ? acts.o2.data() : nullptr;
  bp.dout = datt;
  bp.dq = dproj;
  bp.dk = dproj + s.n_q();
  bp.dv = dproj + s.n_q() + s.n_k();
  if (s.maps() == 2) {
    sc.dlam.assign(acts.lam.size(), 0.0f);
    bp.dlam = sc.dlam.data();
  }
  ctx.attention_backward(bp);

  if (v1) {
    // The layer's lambda is broadcast to every pair: the operator took it as one lambda (1),
    // so dlam[0] is the sum over pairs, formed in double and rounded once.
    const double dl = sc.dlam[0];
    // Eq. 2: d/dlq1 = e1 lk1, d/dlk1 = e1 lq1, d/dlq2 = -e2 lk2, d/dlk2 = -e2 lq2
    for (int64_t i = 0; i < s.D; ++i) {
      g.lambda_q1[i] += static_cast<float>(dl * acts.e1 * w.lambda_k1[i]);
      g.lambda_k1[i] += static_cast<float>(dl * acts.e1 * w.lambda_q1[i]);
      g.lambda_q2[i] -= static_cast<float>(dl * acts.e2 * w.lambda_k2[i]);
      g.lambda_k2[i] -= static_cast<float>(dl * acts.e2 * w.lambda_q2[i]);
    }
  } else if (s.kind == AttnKind::DiffV2) {
    // lam = sigmoid(z): dz = dlam * lam * (1 - lam), into the lambda logits' columns
    sigmoid_bwd(dproj + s.n_q() + s.n_k() + s.n_v(), sc.dlam.data(), acts.lam.data(), BT, s.H,
                np);
  }
  // The operator saw q and k after RoPE; rotate their gradients back.
  ctx.rope(dproj, cos_t, sin_t, B, T, s.q_heads(), s.D, np, T * np, true);
  ctx.rope(dproj + s.n_q(), cos_t, sin_t, B, T, s.k_heads(), s.D, np, T * np, true);
  ctx.linear_backward(dinp, g.proj, dproj, inp, w.proj.f32(), BT, s.C, np);
}

}  // namespace diffattn::nn
