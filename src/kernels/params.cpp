// Filling and validating AttnParams: the one place that decides whether a call is well formed.
// Every message names the operator, the tensor, what was expected and what came.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "diffattn/kernels/attention.h"
#include "kernels/fused.h"

namespace diffattn::kernels {

int64_t AttnProblem::numel(const Shape& s) const {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

void AttnProblem::set_contiguous_strides() {
  q_head_stride = k_head_stride = D;
  v_head_stride = o_head_stride = Dv;
  q_row_stride = q_heads() * D;
  q_batch_stride = Tq * q_row_stride;
  k_row_stride = key_heads() * D;
  k_batch_stride = Tk * k_row_stride;
  v_row_stride = G * Dv;
  v_batch_stride = Tk * v_row_stride;
  o_row_stride = H * Dv;
  o_batch_stride = Tq * o_row_stride;
}

namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + what);
}

void need_rank(const char* op, const char* name, const Shape& s, size_t rank,
               const char* symbols) {
  if (s.size() != rank) {
    std::ostringstream os;
    os << name << " has shape " << shape_str(s) << " (rank " << s.size() << "), expected rank "
       << rank << ' ' << symbols;
    fail(op, os.str());
  }
}

void need_shape(const char* op, const char* name, const Shape& got, const Shape& want,
                const char* symbols, const std::string& why = "") {
  if (got != want) {
    std::ostringstream os;
    os << name << " has shape " << shape_str(got) << ", expected " << symbols << " = "
       << shape_str(want);
    if (!why.empty()) os << " " << why;
    fail(op, os.str());
  }
}

void need_positive(const char* op, const char* what, int64_t n) {
  if (n < 1) fail(op, std::string(what) + " must be at least 1, got " + std::to_string(n));
}

// x in host memory (the CPU backends read it), else an error naming op and the tensor.
void need_host(const char* op, const char* name, const TensorView& x) {
  if (x.device.type != DeviceType::CPU) {
    fail(op, std::string(name) + " is on " + device_name(x.device.type) +
                 ", expected host memory (the CPU backends read it)");
  }
}

// A view's data as float32 on the host: what these operators read.
const float* f32_of(const char* op, const char* name, const TensorView& x) {
  if (x.dtype != DType::F32) {
    fail(op, std::string(name) + " is " + dtype_name(x.dtype) + ", expected float32");
  }
  need_host(op, name, x);
  return static_cast<const float*>(x.data);
}

// k and v: float32, or both BF16 or both F16 (a 16-bit KV cache), on the host; sets kv_dtype.
void kv_of(const char* op, const TensorView& k, const TensorView& v, AttnParams& p) {
  if (k.dtype != v.dtype) {
    fail(op, std::string("k is ") + dtype_name(k.dtype) + " and v is " + dtype_name(v.dtype) +
                 ": K and V must have one type");
  }
  need_host(op, "k", k);
  need_host(op, "v", v);
  p.k = k.data;  // F32, BF16 or F16: the DType has no other
  p.v = v.data;
  p.kv_dtype = k.dtype;
}

void need_data(const char* op, const char* name, const void* data, int64_t numel) {
  if (numel > 0 && data == nullptr) fail(op, std::string(name) + " has no data (null pointer)");
}

// Common checks of q, v and the grouping; returns nothing, fills p's sizes from q and v.
void fill_from_q_v(const char* op, int maps, const TensorView& q, const TensorView& v,
                   AttnParams& p) {
  need_rank(op, "q", q.shape, 4, maps == 2 ? "(B, Tq, 2H, D)" : "(B, Tq, H, D)");
  need_rank(op, "v", v.shape, 4, "(B, Tk, G, Dv)");
  p.maps = maps;
  p.B = q.shape[0];
  p.Tq = q.shape[1];
  p.D = q.shape[3];
  if (maps == 2) {
    if (q.shape[2] % 2 != 0) {
      fail(op, "q has shape " + shape_str(q.shape) + ": its head count " +
                   std::to_string(q.shape[2]) +
                   " must be even, 2H sub-heads (2h for map 1, 2h+1 for map 2)");
    }
    p.H = q.shape[2] / 2;
  } else {
    p.H = q.shape[2];
  }
  p.Tk = v.shape[1];
  p.G = v.shape[2];
  p.Dv = v.shape[3];
  if (p.B < 0 || p.Tq < 0 || p.Tk < 0) fail(op, "negative size in q or v");
  need_positive(op, maps == 2 ? "H (pairs, q.shape[2] / 2)" : "H (heads, q.shape[2])", p.H);
  need_positive(op, "D (q.shape[3])", p.D);
  need_positive(op, "G (key/value heads, v.shape[2])", p.G);
  need_positive(op, "Dv (v.shape[3])", p.Dv);
  if (v.shape[0] != p.B) {
    need_shape(op, "v", v.shape, {p.B, p.Tk, p.G, p.Dv}, "(B, Tk, G, Dv)",
               "(B = " + std::to_string(p.B) + " from q)");
  }
  if (p.H % p.G != 0) {
    std::ostringstream os;
    os << (maps == 2 ? "H = " : "H = ") << p.H << (maps == 2 ? " pairs" : " heads")
       << " (from q " << shape_str(q.shape) << ") is not divisible by G = " << p.G
       << " key/value heads (from v " << shape_str(v.shape) << ")";
    fail(op, os.str());
  }
}

// The batch, row and head strides of a rank-4 view (B, T, heads, dim); its last dimension must
// be contiguous. A dimension of size 1 is never stepped over, so its stride is not checked.
struct Strides4 {
  int64_t batch, row, head;
};
Strides4 take_strides(const char* op, const char* name, const TensorView& x) {
  const Shape st = x.effective_strides();
  if (st.size() != x.shape.size()) {
    fail(op, std::string(name) + " has " + std::to_string(st.size()) + " strides for shape " +
                 shape_str(x.shape) + " of rank " + std::to_string(x.shape.size()));
  }
  for (size_t i = 0; i < st.size(); ++i) {
    if (st[i] < 0 && x.shape[i] > 1) {
      fail(op, std::string(name) + " has strides " + shape_str(st) +
                   ": negative strides are not supported (copy the tensor first)");
    }
  }
  if (x.shape[3] > 1 && st[3] != 1) {
    fail(op, std::string(name) + " has strides " + shape_str(st) + " (elements) for shape " +
                 shape_str(x.shape) + ": its last dimension must be contiguous (stride 1); "
                 "copy the tensor first");
  }
  auto at = [&](size_t i) { return x.shape[i] > 1 ? st[i] : std::max<int64_t>(st[i], 0); };
  return {at(0), at(1), at(2)};
}

void fill_strides(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                  AttnParams& p) {
  const Strides4 sq = take_strides(op, "q", q), sk = take_strides(op, "k", k),
                 sv = take_strides(op, "v", v);
  p.q_batch_stride = sq.batch, p.q_row_stride = sq.row, p.q_head_stride = sq.head;
  p.k_batch_stride = sk.batch, p.k_row_stride = sk.row, p.k_head_stride = sk.head;
  p.v_batch_stride = sv.batch, p.v_row_stride = sv.row, p.v_head_stride = sv.head;
}

void fill_options(const char* op, const AttnOptions& opts, AttnParams& p) {
  if (!std::isfinite(opts.scale)) fail(op, "scale must be finite, got " + std::to_string(opts.scale));
  p.causal = opts.causal;
  p.scale = opts.scale != 0.0f ? opts.scale : 1.0f / std::sqrt(static_cast<float>(p.D));
  p.mode = opts.mode;
}

}  // namespace

AttnParams diff_attn_params(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& lam, const AttnOptions& opts) {
  const char* op = "diff_attention";
  AttnParams p;
  fill_from_q_v(op, 2, q, v, p);
  need_rank(op, "k", k.shape, 4, "(B, Tk, 2G, D) or (B, Tk, G, D)");
  const Shape separate{p.B, p.Tk, 2 * p.G, p.D}, shared{p.B, p.Tk, p.G, p.D};
  if (k.shape == separate) {
    p.shared_keys = false;
  } else if (k.shape == shared) {
    p.shared_keys = true;
  } else {
    std::ostringstream os;
    os << "k has shape " << shape_str(k.shape) << ", expected (B, Tk, 2G, D) = "
       << shape_str(separate) << " (separate keys per map) or (B, Tk, G, D) = "
       << shape_str(shared) << " (shared keys), with B, D from q " << shape_str(q.shape)
       << " and Tk, G from v " << shape_str(v.shape);
    fail(op, os.str());
  }
  if (lam.shape.size() == 1 && lam.shape[0] == 1 && p.H > 1) {
    p.lam_scalar = true;  // one lambda for every pair
    p.lam_per_token = false;
  } else if (lam.shape.size() == 1) {
    need_shape(op, "lam", lam.shape, {p.H}, "(H)", "(one lambda per pair, or (1) for all)");
    p.lam_per_token = false;
  } else if (lam.shape.size() == 3) {
    need_shape(op, "lam", lam.shape, {p.B, p.Tq, p.H}, "(B, Tq, H)",
               "(one lambda per token and pair)");
    p.lam_per_token = true;
  } else {
    fail(op, "lam has shape " + shape_str(lam.shape) + ", expected (H) = " +
                 shape_str({p.H}) + " or (B, Tq, H) = " + shape_str({p.B, p.Tq, p.H}));
  }
  fill_options(op, opts, p);
  p.q = f32_of(op, "q", q);
  kv_of(op, k, v, p);
  p.lam = f32_of(op, "lam", lam);
  p.set_contiguous_strides();
  fill_strides(op, q, k, v, p);
  if (!lam.strides.empty() && lam.strides != contiguous_strides(lam.shape) && p.H > 1) {
    fail(op, "lam has strides " + shape_str(lam.strides) + ": lambda must be contiguous");
  }
  need_data(op, "q", q.data, p.numel(p.q_shape()));
  need_data(op, "k", k.data, p.numel(p.k_shape()));
  need_data(op, "v", v.data, p.numel(p.v_shape()));
  need_data(op, "lam", lam.data, p.numel(p.lam_shape()));
  return p;
}

AttnParams attn_params(const TensorView& q, const TensorView& k, const TensorView& v,
                       const AttnOptions& opts) {
  const char* op = "attention";
  AttnParams p;
  fill_from_q_v(op, 1, q, v, p);
  need_rank(op, "k", k.shape, 4, "(B, Tk, G, D)");
  need_shape(op, "k", k.shape, {p.B, p.Tk, p.G, p.D}, "(B, Tk, G, D)",
             "(B, D from q " + shape_str(q.shape) + ", Tk, G from v " + shape_str(v.shape) +
                 ")");
  fill_options(op, opts, p);
  p.mode = DiffMode::Signed;
  p.q = f32_of(op, "q", q);
  kv_of(op, k, v, p);
  p.set_contiguous_strides();
  fill_strides(op, q, k, v, p);
  need_data(op, "q", q.data, p.numel(p.q_shape()));
  need_data(op, "k", k.data, p.numel(p.k_shape()));
  need_data(op, "v", v.data, p.numel(p.v_shape()));
  return p;
}

namespace {

// A (B, T, heads, dim) layout with a contiguous last dimension. Inputs may repeat elements
// (a broadcast view reads the same numbers twice); an output must not, or two results would
// land on one element: its dimensions, sorted by stride, must each step past everything the
// smaller ones span.
void check_layout(const char* op, const char* name, bool written, int64_t B, int64_t T,
                  int64_t heads, int64_t dim, int64_t batch_stride, int64_t row_stride,
                  int64_t head_stride) {
  const int64_t size[4] = {B, T, heads, dim}, stride[4] = {batch_stride, row_stride, head_stride, 1};
  for (int i = 0; i < 3; ++i) {
    if (stride[i] < 0 && size[i] > 1) {
      fail(op, std::string(name) + ": negative stride " + std::to_string(stride[i]));
    }
  }
  if (!written) return;
  int order[4] = {3, 2, 1, 0};
  std::sort(order, order + 4, [&](int a, int b) { return stride[a] < stride[b]; });
  int64_t span = 0;  // the largest offset the dimensions seen so far reach
  for (int i : order) {
    if (size[i] <= 1) continue;
    if (stride[i] <= span) {
      std::ostringstream os;
      os << name << " has shape " << shape_str({B, T, heads, dim}) << " and strides "
         << shape_str({batch_stride, row_stride, head_stride, 1})
         << ": its elements overlap (an output needs a stride above " << span
         << " for dimension " << i << ")";
      fail(op, os.str());
    }
    span += (size[i] - 1) * stride[i];
  }
}

}  // namespace

namespace {

// Sizes, options, input layouts and data, and out's layout (which dout shares).
void check_problem(const AttnProblem& p, const char* op) {
  if (p.maps != 1 && p.maps != 2) fail(op, "maps must be 1 or 2, got " + std::to_string(p.maps));
  if (p.B < 0 || p.Tq < 0 || p.Tk < 0) fail(op, "negative batch or sequence size");
  need_positive(op, "H", p.H);
  need_positive(op, "G", p.G);
  need_positive(op, "D", p.D);
  need_positive(op, "Dv", p.Dv);
  if (p.H % p.G != 0) {
    fail(op, "H = " + std::to_string(p.H) + " is not divisible by G = " + std::to_string(p.G));
  }
  if (p.noise_share < 1 || (p.noise_share > 1 && (p.maps != 2 || p.group_size() % p.noise_share != 0))) {
    fail(op, "noise_share = " + std::to_string(p.noise_share) +
                 " must be 1, or with maps == 2 divide the pairs per key/value group (" +
                 std::to_string(p.group_size()) + ")");
  }
  if (!std::isfinite(p.scale)) fail(op, "scale must be finite");
  check_layout(op, "q", false, p.B, p.Tq, p.q_heads(), p.D, p.q_batch_stride, p.q_row_stride,
               p.q_head_stride);
  check_layout(op, "k", false, p.B, p.Tk, p.key_heads(), p.D, p.k_batch_stride, p.k_row_stride,
               p.k_head_stride);
  check_layout(op, "v", false, p.B, p.Tk, p.G, p.Dv, p.v_batch_stride, p.v_row_stride,
               p.v_head_stride);
  check_layout(op, "out", true, p.B, p.Tq, p.H, p.Dv, p.o_batch_stride, p.o_row_stride,
               p.o_head_stride);
  need_data(op, "q", p.q, p.numel(p.q_shape()));
  if (p.kv_dtype != DType::F32 && p.kv_dtype != DType::BF16 && p.kv_dtype != DType::F16) {
    fail(op, "kv_dtype is not F32, BF16 or F16");
  }
  need_data(op, "k", p.k, p.numel(p.k_shape()));
  need_data(op, "v", p.v, p.numel(p.v_shape()));
  if (p.maps == 2) need_data(op, "lam", p.lam, p.numel(p.lam_shape()));
}

}  // namespace

void check_params(const AttnProblem& p, const char* op) { check_problem(p, op); }

void check_params(const AttnParams& p, const char* op) {
  check_problem(p, op);
  need_data(op, "out", p.out, p.numel(p.out_shape()));
}

void check_lambda(const AttnProblem& p, const char* op) {
  if (p.maps == 2 && p.lam != nullptr) {
    const int64_t n = p.numel(p.lam_shape());
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(p.lam[i])) {
        std::ostringstream os;
        os << "lam[" << i << "] is " << p.lam[i] << " (lam has shape " << shape_str(p.lam_shape())
           << "): lambda must be finite";
        fail(op, os.str());
      }
    }
  }
}

void check_params(const AttnBwdParams& p, const char* op) {
  check_problem(p, op);
  if (p.kv_dtype != DType::F32) {
    fail(op, std::string("k and v are ") + dtype_name(p.kv_dtype) +
                 " (a low-precision KV cache): the backward needs float32 k and v");
  }
  need_data(op, "out (saved by the forward)", p.out, p.numel(p.out_shape()));
  if (p.maps == 2 && p.mode != DiffMode::Signed) {
    fail(op, "the backward is defined for signed differential attention and standard "
             "attention; clamp mode has a forward only");
  }
  const int64_t nq = p.numel(p.out_shape());
  need_data(op, "dout", p.dout, nq);
  // Gradients take their input's layout, so that layout must not overlap itself.
  check_layout(op, "dq (q's layout)", true, p.B, p.Tq, p.q_heads(), p.D, p.q_batch_stride,
               p.q_row_stride, p.q_head_stride);
  check_layout(op, "dk (k's layout)", true, p.B, p.Tk, p.key_heads(), p.D, p.k_batch_stride,
               p.k_row_stride, p.k_head_stride);
  check_layout(op, "dv (v's layout)", true, p.B, p.Tk, p.G, p.Dv, p.v_batch_stride,
               p.v_row_stride, p.v_head_stride);
  need_data(op, "lse (saved by the forward)", p.lse, p.numel(p.lse_shape()));
  need_data(op, "dq", p.dq, p.numel(p.q_shape()));
  need_data(op, "dk", p.dk, p.numel(p.k_shape()));
  need_data(op, "dv", p.dv, p.numel(p.v_shape()));
  if (p.maps == 2) {
    need_data(op, "o2 (saved by the forward)", p.o2, nq);
    need_data(op, "dlam", p.dlam, p.numel(p.lam_shape()));
  }
}

void check_params(const PagedAttnParams& p, const char* op) {
  if (p.maps != 1 && p.maps != 2) fail(op, "maps must be 1 or 2, got " + std::to_string(p.maps));
  if (p.B < 0) fail(op, "B (sequences) must be >= 0, got " + std::to_string(p.B));
  need_positive(op, "H", p.H);
  need_positive(op, "G", p.G);
  need_positive(op, "D", p.D);
  need_positive(op, "Dv", p.Dv);
  if (p.H % p.G != 0) {
    fail(op, "H = " + std::to_string(p.H) + " is not divisible by G = " + std::to_string(p.G));
  }
  if (p.noise_share < 1 || (p.noise_share > 1 && (p.maps != 2 || (p.H / p.G) % p.noise_share != 0))) {
    fail(op, "noise_share = " + std::to_string(p.noise_share) +
                 " must be 1, or with maps == 2 divide the pairs per key/value group (" +
                 std::to_string(p.H / p.G) + ")");
  }
  if (!std::isfinite(p.scale) || p.scale == 0.0f) {
    fail(op, "scale must be finite and nonzero (it is not defaulted here), got " +
                 std::to_string(p.scale));
  }
  need_positive(op, "n_blocks", p.n_blocks);
  need_positive(op, "block_size", p.block_size);
  if (p.n_blocks > (int64_t{1} << 31)) {
    fail(op, "n_blocks = " + std::to_string(p.n_blocks) + " is beyond int32 block ids");
  }
  if (p.key_chunk < 0) {
    fail(op, "key_chunk must be >= 0 (0 picks), got " + std::to_string(p.key_chunk));
  }
  if (p.B == 0) return;
  // The query rows: q_starts from 0, non-decreasing (read before the layouts use the count).
  if (p.q_starts != nullptr) {
    if (p.q_starts[0] != 0) fail(op, "q_starts[0] = " + std::to_string(p.q_starts[0]) + ", not 0");
    for (int64_t b = 0; b < p.B; ++b) {
      if (p.q_starts[b + 1] < p.q_starts[b]) {
        std::ostringstream os;
        os << "q_starts[" << b + 1 << "] = " << p.q_starts[b + 1] << " is below q_starts[" << b
           << "] = " << p.q_starts[b] << " (a sequence's rows are q_starts[b] .. q_starts[b + 1] - 1)";
        fail(op, os.str());
      }
    }
  }
  const int64_t rows = p.rows();
  check_layout(op, "q", false, rows, 1, p.maps * p.H, p.D, p.q_row_stride, 0, p.q_head_stride);
  check_layout(op, "out", true, rows, 1, p.H, p.Dv, p.o_row_stride, 0, p.o_head_stride);
  need_positive(op, "table_stride (entries per block-table row)", p.table_stride);
  need_data(op, "q", p.q, 1);
  need_data(op, "out", p.out, 1);
  need_data(op, "block_tables", p.block_tables, 1);
  need_data(op, "seq_lens", p.seq_lens, 1);
  if (p.maps == 2) need_data(op, "lam", p.lam, 1);
  if (p.kv_dtype != DType::F32 && p.kv_dtype != DType::BF16 && p.kv_dtype != DType::F16) {
    fail(op, "kv_dtype is not F32, BF16 or F16");
  }
  need_data(op, "k_pool", p.k_pool, 1);
  need_data(op, "v_pool", p.v_pool, 1);
  // The tables: each sequence's length fits its row, and every block it reads is in the pool.
  const int64_t cap = p.table_stride * p.block_size;
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t len = p.seq_lens[b], n = p.rows_of(b);
    if (len < 0 || len > cap) {
      std::ostringstream os;
      os << "seq_lens[" << b << "] = " << len << " is outside 0.." << cap << " (its block table has "
         << p.table_stride << " entries of " << p.block_size << " positions)";
      fail(op, os.str());
    }
    if (p.q_starts != nullptr && len < n) {
      std::ostringstream os;
      os << "seq_lens[" << b << "] = " << len << " is fewer than the sequence's " << n
         << " query rows (they are its last positions, their keys written already)";
      fail(op, os.str());
    }
    const int64_t used = (len + p.block_size - 1) / p.block_size;
    for (int64_t i = 0; i < used; ++i) {
      const int32_t id = p.block_tables[b * p.table_stride + i];
      if (id < 0 || id >= p.n_blocks) {
        std::ostringstream os;
        os << "block_tables[" << b << "][" << i << "] = " << id << " is outside the pool of "
           << p.n_blocks << " blocks (sequence " << b << " has " << len << " positions)";
        fail(op, os.str());
      }
    }
  }
}

double visible_pairs(const AttnProblem& p) {
  if (!p.causal) return static_cast<double>(p.Tq) * static_cast<double>(p.Tk);
  double n = 0;
  for (int64_t i = 0; i < p.Tq; ++i) {
    const int64_t last = p.last_key(i);
    if (last >= 0) n += static_cast<double>(std::min(last + 1, p.Tk));
  }
  return n;
}

double attention_fwd_flops(const AttnProblem& p) {
  // Per visible (query, key) pair and map: a D-long dot product and a Dv-long axpy.
  return visible_pairs(p) * static_cast<double>(p.B) * static_cast<double>(p.H) * p.maps * 2.0 *
         static_cast<double>(p.D + p.Dv);
}

}  // namespace diffattn::kernels
