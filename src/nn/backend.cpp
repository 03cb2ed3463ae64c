// The op tables (include/diffattn/nn/backend.h): the reference's plain loops in double and the
// cpu table's fast kernels, and the execution context's checked calls.
#include "diffattn/nn/backend.h"

#include <cmath>
#include <string>
#include <vector>

#include "diffattn/base/error.h"
#include "diffattn/nn/layers.h"
#include "diffattn/nn/mamba.h"

namespace diffattn::nn {

namespace {

bool any_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// Both tables run every op; the backward and the norms, RoPE and SwiGLU on float32 only (the
// 16-bit types are weights and K/V caches).
bool host_supports(Op op, DType t) {
  switch (op) {
    case Op::Attention:
    case Op::PagedAttention:
    case Op::LinearFewRows:
    case Op::LinearManyRows: return any_dtype(t);
    case Op::AttentionBackward:
    case Op::RmsNorm:
    case Op::Rope:
    case Op::SwiGlu:
    case Op::LinearBackward:
    case Op::RmsNormBackward:
    case Op::SwiGluBackward:
    case Op::LayerNorm:
    case Op::PolyNorm: return t == DType::F32;
  }
  return false;
}

// ---- reference: plain loops accumulated in double ----

void ref_attention(const ExecContext&, const kernels::AttnParams& p) {
  kernels::attention_fwd(p, kernels::Backend::Reference);
}
void ref_attention_backward(const ExecContext&, const kernels::AttnBwdParams& p) {
  kernels::attention_bwd(p, kernels::Backend::Reference);  // honours the saved lse
}
void ref_paged(const ExecContext&, const kernels::PagedAttnParams& p) {
  kernels::attention_paged(p, kernels::Backend::Reference);
}

void ref_linear(const ExecContext&, float* out, const float* inp, const TensorView& w, int64_t N,
                int64_t C, int64_t OC, int64_t ldo) {
  if (w.data == nullptr) throw InvalidArgument("reference linear: the weight has no data");
  if (!ldo) ldo = OC;
  if (ldo < OC) throw InvalidArgument("reference linear: ldo " + std::to_string(ldo) + " < OC " + std::to_string(OC));
  std::vector<float> row(static_cast<size_t>(C));
  const auto* base = static_cast<const char*>(w.data);
  const size_t es = dtype_size(w.dtype);
  for (int64_t o = 0; o < OC; ++o) {
    convert_to_f32(row.data(), base + static_cast<size_t>(o * C) * es, w.dtype, C);
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      const float* x = inp + n * C;
      for (int64_t c = 0; c < C; ++c) acc += static_cast<double>(x[c]) * row[static_cast<size_t>(c)];
      out[n * ldo + o] = static_cast<float>(acc);
    }
  }
}

void ref_rmsnorm(const ExecContext&, float* out, float* rstd, const float* inp, const float* w,
                 int64_t N, int64_t C, float eps, int64_t ldi, int64_t ldo) {
  if (!ldi) ldi = C;
  if (!ldo) ldo = C;
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * ldi;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * x[c];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) out[i * ldo + c] = static_cast<float>(x[c] * r * w[c]);
    rstd[i] = static_cast<float>(r);
  }
}

void ref_rope(const ExecContext&, float* x, const float* cos_t, const float* sin_t, int64_t B,
              int64_t T, int64_t nh, int64_t D, int64_t ld, int64_t lb, bool inverse) {
  const int64_t half = D / 2;
  const double sgn = inverse ? -1.0 : 1.0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < nh; ++h) {
        float* u = x + b * lb + t * ld + h * D;
        for (int64_t j = 0; j < half; ++j) {
          const double c = cos_t[t * half + j], s = sgn * sin_t[t * half + j];
          const double u0 = u[2 * j], u1 = u[2 * j + 1];
          u[2 * j] = static_cast<float>(u0 * c - u1 * s);
          u[2 * j + 1] = static_cast<float>(u0 * s + u1 * c);
        }
      }
    }
  }
}

void ref_swiglu(const ExecContext&, float* out, const float* gate, const float* up, int64_t N,
                int64_t F, int64_t ldg) {
  if (!ldg) ldg = F;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t f = 0; f < F; ++f) {
      const double g = gate[i * ldg + f];
      out[i * F + f] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i * ldg + f]);
    }
  }
}

void ref_linear_backward(const ExecContext&, float* dinp, float* dweight, const float* dout,
                         const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC,
                         int64_t ldd, bool dinp_overwrite) {
  if (!ldd) ldd = OC;
  if (dinp != nullptr) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = dinp_overwrite ? 0.0 : dinp[n * C + c];
        for (int64_t o = 0; o < OC; ++o) acc += static_cast<double>(dout[n * ldd + o]) * weight[o * C + c];
        dinp[n * C + c] = static_cast<float>(acc);
      }
    }
  }
  for (int64_t o = 0; o < OC; ++o) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = dweight[o * C + c];
      for (int64_t n = 0; n < N; ++n) acc += static_cast<double>(dout[n * ldd + o]) * inp[n * C + c];
      dweight[o * C + c] = static_cast<float>(acc);
    }
  }
}

// y = x r w (r the saved rstd): dx = r dy w - r^3 / C x sum(dy w x), dw = sum over rows dy x r.
void ref_rmsnorm_backward(const ExecContext&, float* dinp, float* dweight, const float* dout,
                          const float* inp, const float* weight, const float* rstd, int64_t N,
                          int64_t C, int64_t ldd, int64_t ldi) {
  if (!ldd) ldd = C;
  if (!ldi) ldi = C;
  std::vector<double> dw(static_cast<size_t>(C), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * ldi;
    const float* dy = dout + i * ldd;
    const double r = rstd[i];
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dy[c]) * weight[c] * x[c];
    for (int64_t c = 0; c < C; ++c) {
      dw[static_cast<size_t>(c)] += static_cast<double>(dy[c]) * x[c] * r;
      dinp[i * C + c] = static_cast<float>(dinp[i * C + c] + r * dy[c] * weight[c] -
                                           r * r * r * dot / static_cast<double>(C) * x[c]);
    }
  }
  for (int64_t c = 0; c < C; ++c) dweight[c] = static_cast<float>(dweight[c] + dw[static_cast<size_t>(c)]);
}

void ref_swiglu_backward(const ExecContext&, float* dgate, float* dup, const float* dout,
                         const float* gate, const float* up, int64_t N, int64_t F, int64_t ldg) {
  if (!ldg) ldg = F;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t f = 0; f < F; ++f) {
      const double g = gate[i * ldg + f], u = up[i * ldg + f], d = dout[i * F + f];
      const double sg = 1.0 / (1.0 + std::exp(-g));
      dup[i * ldg + f] = static_cast<float>(dup[i * ldg + f] + d * g * sg);
      dgate[i * ldg + f] = static_cast<float>(dgate[i * ldg + f] + d * u * sg * (1.0 + g * (1.0 - sg)));
    }
  }
}

void ref_layernorm(const ExecContext&, float* out, const float* inp, const float* w, const float* b,
                   int64_t N, int64_t C, float eps) {
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    double s = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const double mean = s / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) v += (x[c] - mean) * (x[c] - mean);
    const double r = 1.0 / std::sqrt(v / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = static_cast<float>((x[c] - mean) * r * w[c] + b[c]);
  }
}

// (w0 n(z^3) + w1 n(z^2) + w2 n(z) + b) * up, n(u) = u / sqrt(mean(u^2) + eps) per row.
void ref_polynorm(const ExecContext&, float* out, const float* gate, const float* up, int64_t N,
                  int64_t F, int64_t ldg, const float* w, const float* b, float eps) {
  if (!ldg) ldg = F;
  for (int64_t i = 0; i < N; ++i) {
    const float* g = gate + i * ldg;
    double s[3] = {0, 0, 0};  // mean of (z^k)^2 for k = 1, 2, 3
    for (int64_t f = 0; f < F; ++f) {
      const double z = g[f];
      for (int k = 0; k < 3; ++k) s[k] += std::pow(z, 2 * (k + 1));
    }
    double inv[3];
    for (int k = 0; k < 3; ++k) inv[k] = 1.0 / std::sqrt(s[k] / static_cast<double>(F) + eps);
    for (int64_t f = 0; f < F; ++f) {
      const double z = g[f];
      const double a = w[0] * z * z * z * inv[2] + w[1] * z * z * inv[1] + w[2] * z * inv[0] + b[0];
      out[i * F + f] = static_cast<float>(a * up[i * ldg + f]);
    }
  }
}

// ---- cpu: the fast kernels ----

void cpu_attention(const ExecContext&, const kernels::AttnParams& p) { kernels::attention_fwd(p); }
void cpu_attention_backward(const ExecContext&, const kernels::AttnBwdParams& p) {
  kernels::attention_bwd(p);  // the fused backward reads the saved lse (no forward recomputed)
}
void cpu_paged(const ExecContext&, const kernels::PagedAttnParams& p) { kernels::attention_paged(p); }
// linear_fwd picks the multi-row matrix-vector kernel or sgemm by N itself: one entry serves both.
void cpu_linear(const ExecContext&, float* out, const float* inp, const TensorView& w, int64_t N,
                int64_t C, int64_t OC, int64_t ldo) {
  linear_fwd(out, inp, w, N, C, OC, ldo);
}
void cpu_rmsnorm(const ExecContext&, float* out, float* rstd, const float* inp, const float* w,
                 int64_t N, int64_t C, float eps, int64_t ldi, int64_t ldo) {
  rmsnorm_fwd(out, rstd, inp, w, N, C, eps, ldi, ldo);
}
void cpu_rope(const ExecContext&, float* x, const float* cos_t, const float* sin_t, int64_t B,
              int64_t T, int64_t nh, int64_t D, int64_t ld, int64_t lb, bool inverse) {
  rope_apply(x, cos_t, sin_t, B, T, nh, D, ld, lb, inverse);
}
void cpu_swiglu(const ExecContext&, float* out, const float* gate, const float* up, int64_t N,
                int64_t F, int64_t ldg) {
  swiglu_fwd(out, gate, up, N, F, ldg);
}

void cpu_linear_backward(const ExecContext&, float* dinp, float* dweight, const float* dout,
                         const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC,
                         int64_t ldd, bool dinp_overwrite) {
  linear_bwd(dinp, dweight, dout, inp, weight, N, C, OC, ldd, dinp_overwrite);
}
void cpu_rmsnorm_backward(const ExecContext&, float* dinp, float* dweight, const float* dout,
                          const float* inp, const float* weight, const float* rstd, int64_t N,
                          int64_t C, int64_t ldd, int64_t ldi) {
  rmsnorm_bwd(dinp, dweight, dout, inp, weight, rstd, N, C, ldd, ldi);
}
void cpu_swiglu_backward(const ExecContext&, float* dgate, float* dup, const float* dout,
                         const float* gate, const float* up, int64_t N, int64_t F, int64_t ldg) {
  swiglu_bwd(dgate, dup, dout, gate, up, N, F, ldg);
}

void cpu_layernorm(const ExecContext&, float* out, const float* inp, const float* w, const float* b,
                   int64_t N, int64_t C, float eps) {
  layernorm_fwd(out, inp, w, b, N, C, eps);
}
void cpu_polynorm(const ExecContext&, float* out, const float* gate, const float* up, int64_t N,
                  int64_t F, int64_t ldg, const float* w, const float* b, float eps) {
  polynorm_fwd(out, gate, up, N, F, ldg, w, b, eps);
}

OpTable make_reference() {
  OpTable t;
  t.name = "reference";
  t.supports = host_supports;
  t.attention = ref_attention;
  t.attention_backward = ref_attention_backward;
  t.paged_attention = ref_paged;
  t.linear_few_rows = ref_linear;
  t.linear_many_rows = ref_linear;
  t.rmsnorm = ref_rmsnorm;
  t.rope = ref_rope;
  t.swiglu = ref_swiglu;
  t.linear_backward = ref_linear_backward;
  t.rmsnorm_backward = ref_rmsnorm_backward;
  t.swiglu_backward = ref_swiglu_backward;
  t.layernorm = ref_layernorm;
  t.polynorm = ref_polynorm;
  return t;
}

OpTable make_cpu() {
  OpTable t;
  t.name = "cpu";
  t.supports = host_supports;
  t.attention = cpu_attention;
  t.attention_backward = cpu_attention_backward;
  t.paged_attention = cpu_paged;
  t.linear_few_rows = cpu_linear;
  t.linear_many_rows = cpu_linear;
  t.rmsnorm = cpu_rmsnorm;
  t.rope = cpu_rope;
  t.swiglu = cpu_swiglu;
  t.linear_backward = cpu_linear_backward;
  t.rmsnorm_backward = cpu_rmsnorm_backward;
  t.swiglu_backward = cpu_swiglu_backward;
  t.layernorm = cpu_layernorm;
  t.polynorm = cpu_polynorm;
  return t;
}

// The table's entry for op, or an InvalidArgument naming the backend and the op.
template <class Fn>
Fn entry(const OpTable& t, Fn fn, Op op) {
  if (fn == nullptr) {
    throw InvalidArgument(std::string("backend ") + t.name + " does not provide " + op_name(op));
  }
  return fn;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::Attention: return "attention";
    case Op::AttentionBackward: return "attention_backward";
    case Op::PagedAttention: return "paged_attention";
    case Op::LinearFewRows: return "linear_few_rows";
    case Op::LinearManyRows: return "linear_many_rows";
    case Op::RmsNorm: return "rmsnorm";
    case Op::Rope: return "rope";
    case Op::SwiGlu: return "swiglu";
    case Op::LinearBackward: return "linear_backward";
    case Op::RmsNormBackward: return "rmsnorm_backward";
    case Op::SwiGluBackward: return "swiglu_backward";
    case Op::LayerNorm: return "layernorm";
    case Op::PolyNorm: return "polynorm";
  }
  return "unknown op";
}

int64_t few_rows_max(DType t) { return t == DType::F32 ? kGemvMaxN : kGemvMaxN16; }

const OpTable& reference_ops() {
  static const OpTable t = make_reference();
  return t;
}

const OpTable& cpu_ops() {
  static const OpTable t = make_cpu();
  return t;
}

const ExecContext& cpu_context() {
  static const ExecContext c{&cpu_ops()};
  return c;
}

const ExecContext& reference_context() {
  static const ExecContext c{&reference_ops()};
  return c;
}

const ExecContext& context_for(kernels::Backend b) {
  return b == kernels::Backend::Reference ? reference_context() : cpu_context();
}

const ExecContext& context_named(const std::string& name, const std::string& where) {
  if (name == "cpu") return cpu_context();
  if (name == "reference") return reference_context();
  throw InvalidArgument(where + " is \"" + name + "\", expected \"cpu\" or \"reference\"");
}

bool ExecContext::supports(Op op, DType t) const {
  if (ops == nullptr || ops->supports == nullptr) return false;
  bool has = false;
  switch (op) {
    case Op::Attention: has = ops->attention != nullptr; break;
    case Op::AttentionBackward: has = ops->attention_backward != nullptr; break;
    case Op::PagedAttention: has = ops->paged_attention != nullptr; break;
    case Op::LinearFewRows: has = ops->linear_few_rows != nullptr; break;
    case Op::LinearManyRows: has = ops->linear_many_rows != nullptr; break;
    case Op::RmsNorm: has = ops->rmsnorm != nullptr; break;
    case Op::Rope: has = ops->rope != nullptr; break;
    case Op::SwiGlu: has = ops->swiglu != nullptr; break;
    case Op::LinearBackward: has = ops->linear_backward != nullptr; break;
    case Op::RmsNormBackward: has = ops->rmsnorm_backward != nullptr; break;
    case Op::SwiGluBackward: has = ops->swiglu_backward != nullptr; break;
    case Op::LayerNorm: has = ops->layernorm != nullptr; break;
    case Op::PolyNorm: has = ops->polynorm != nullptr; break;
  }
  return has && ops->supports(op, t);
}

void ExecContext::require(Op op, DType t, const char* what) const {
  if (supports(op, t)) return;
  throw InvalidArgument(std::string(what) + ": backend " + (ops ? ops->name : "(none)") +
                        " does not support " + op_name(op) + " (" + dtype_name(t) + ")");
}

void ExecContext::attention(const kernels::AttnParams& p) const {
  entry(*ops, ops->attention, Op::Attention)(*this, p);
}

void ExecContext::attention_backward(const kernels::AttnBwdParams& p) const {
  entry(*ops, ops->attention_backward, Op::AttentionBackward)(*this, p);
}

void ExecContext::paged_attention(const kernels::PagedAttnParams& p) const {
  entry(*ops, ops->paged_attention, Op::PagedAttention)(*this, p);
}

void ExecContext::linear(float* out, const float* inp, const TensorView& w, int64_t N, int64_t C,
                         int64_t OC, int64_t ldo) const {
  if (N <= few_rows_max(w.dtype)) {
    entry(*ops, ops->linear_few_rows, Op::LinearFewRows)(*this, out, inp, w, N, C, OC, ldo);
  } else {
    entry(*ops, ops->linear_many_rows, Op::LinearManyRows)(*this, out, inp, w, N, C, OC, ldo);
  }
}

void ExecContext::rmsnorm(float* out, float* rstd, const float* inp, const float* w, int64_t N,
                          int64_t C, float eps, int64_t ldi, int64_t ldo) const {
  entry(*ops, ops->rmsnorm, Op::RmsNorm)(*this, out, rstd, inp, w, N, C, eps, ldi, ldo);
}

void ExecContext::rope(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T,
                       int64_t nh, int64_t D, int64_t ld, int64_t lb, bool inverse) const {
  entry(*ops, ops->rope, Op::Rope)(*this, x, cos_t, sin_t, B, T, nh, D, ld, lb, inverse);
}

void ExecContext::swiglu(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                         int64_t ldg) const {
  entry(*ops, ops->swiglu, Op::SwiGlu)(*this, out, gate, up, N, F, ldg);
}

void ExecContext::linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                  const float* weight, int64_t N, int64_t C, int64_t OC, int64_t ldd,
                                  bool dinp_overwrite) const {
  entry(*ops, ops->linear_backward, Op::LinearBackward)(*this, dinp, dweight, dout, inp, weight, N, C,
                                                         OC, ldd, dinp_overwrite);
}

void ExecContext::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                   const float* weight, const float* rstd, int64_t N, int64_t C,
                                   int64_t ldd, int64_t ldi) const {
  entry(*ops, ops->rmsnorm_backward, Op::RmsNormBackward)(*this, dinp, dweight, dout, inp, weight,
                                                           rstd, N, C, ldd, ldi);
}

void ExecContext::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                  const float* up, int64_t N, int64_t F, int64_t ldg) const {
  entry(*ops, ops->swiglu_backward, Op::SwiGluBackward)(*this, dgate, dup, dout, gate, up, N, F, ldg);
}

void ExecContext::layernorm(float* out, const float* inp, const float* w, const float* b, int64_t N,
                            int64_t C, float eps) const {
  entry(*ops, ops->layernorm, Op::LayerNorm)(*this, out, inp, w, b, N, C, eps);
}

void ExecContext::polynorm(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                           int64_t ldg, const float* w, const float* b, float eps) const {
  entry(*ops, ops->polynorm, Op::PolyNorm)(*this, out, gate, up, N, F, ldg, w, b, eps);
}

}  // namespace diffattn::nn
