// The backend seam of the hot ops (docs/DESIGN.md, "Backends"): a table of function pointers per
// backend, one entry per op the layer bodies run (attention forward, backward and paged, the
// few-row and the many-row products, RMSNorm, RoPE, SwiGLU), a supports(op, dtype) test, and
// the execution context a runner (model::TrainContext, infer::Session) holds and hands to every
// layer body. The layers call ops only through the context, so a new backend (CUDA) is a new
// table and a context that names it, not edits across nn.
//
// Two tables today, both over host memory:
//   reference  plain loops accumulated in double, the attention oracle (kernels'
//              Backend::Reference): what every fast path is tested against, now for whole
//              models too (a TrainContext or a Session on reference_context()).
//   cpu        the fast kernels: BLAS and the multi-row matrix-vector products, the Highway
//              attention kernels (attention_* with Backend::Auto, so DIFFATTN_BACKEND=reference
//              still forces the attention oracle), the nn row loops.
// Not in the tables yet (they run on the host whatever the context): the embedding gather, bias
// adds, the training backward of the dense layers (linear, RMSNorm, SwiGLU: training is float32
// on the host), the Motif-2 PolyNorm and the SambaY pieces (LayerNorm, Mamba, GMU).
#pragma once

#include <cstdint>
#include <string>

#include "diffattn/base/dtype.h"
#include "diffattn/base/tensor.h"
#include "diffattn/kernels/attention.h"

namespace diffattn::nn {

enum class Op : int {
  Attention,          // kernels::AttnParams forward (training, evaluation, windows)
  AttentionBackward,  // kernels::AttnBwdParams: must honour the saved lse
  PagedAttention,     // kernels::PagedAttnParams (inference: decode steps and prompt chunks)
  LinearFewRows,      // out (N, OC) = inp (N, C) W^T for N up to few_rows_max(dtype)
  LinearManyRows,     // the same above it (prefill, training)
  RmsNorm,
  Rope,                // also its backward (the inverse rotation)
  SwiGlu,
  LinearBackward,      // training: dinp (+)= dout W, dW += dout^T inp (float32 weights)
  RmsNormBackward,     // training: dinp += ..., dweight += ... from the saved rstd
  SwiGluBackward,      // training: dgate, dup += ...
  LayerNorm,           // SambaY's norms (nn::layernorm_fwd)
  PolyNorm,            // Motif-2's MLP gate (nn::polynorm_fwd)
};
inline constexpr int kNumOps = 13;
const char* op_name(Op op);  // "attention", "linear_few_rows", ...

// The most rows the few-row product takes for weights of type t: nn::kGemvMaxN (float32) or
// nn::kGemvMaxN16 (BF16, F16), where the multi-row matrix-vector kernel stops beating sgemm.
int64_t few_rows_max(DType t);

struct ExecContext;

// A backend: its name, where its tensors live, and one entry per op (null: not provided).
// Entries follow the nn functions of the same name (layers.h) with the context first.
struct OpTable {
  const char* name = "";
  DeviceType device = DeviceType::CPU;
  // Whether the backend runs op with weights (the products), K/V (attention) or, elsewhere,
  // float32 data of type t. A null entry is never supported.
  bool (*supports)(Op op, DType t) = nullptr;

  void (*attention)(const ExecContext& ctx, const kernels::AttnParams& p) = nullptr;
  void (*attention_backward)(const ExecContext& ctx, const kernels::AttnBwdParams& p) = nullptr;
  void (*paged_attention)(const ExecContext& ctx, const kernels::PagedAttnParams& p) = nullptr;
  void (*linear_few_rows)(const ExecContext& ctx, float* out, const float* inp, const TensorView& w,
                          int64_t N, int64_t C, int64_t OC, int64_t ldo) = nullptr;
  void (*linear_many_rows)(const ExecContext& ctx, float* out, const float* inp, const TensorView& w,
                           int64_t N, int64_t C, int64_t OC, int64_t ldo) = nullptr;
  void (*rmsnorm)(const ExecContext& ctx, float* out, float* rstd, const float* inp, const float* w,
                  int64_t N, int64_t C, float eps, int64_t ldi, int64_t ldo) = nullptr;
  void (*rope)(const ExecContext& ctx, float* x, const float* cos_t, const float* sin_t, int64_t B,
               int64_t T, int64_t nh, int64_t D, int64_t ld, int64_t lb, bool inverse) = nullptr;
  void (*swiglu)(const ExecContext& ctx, float* out, const float* gate, const float* up, int64_t N,
                 int64_t F, int64_t ldg) = nullptr;
  void (*linear_backward)(const ExecContext& ctx, float* dinp, float* dweight, const float* dout,
                          const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC,
                          int64_t ldd, bool dinp_overwrite) = nullptr;
  void (*rmsnorm_backward)(const ExecContext& ctx, float* dinp, float* dweight, const float* dout,
                           const float* inp, const float* weight, const float* rstd, int64_t N,
                           int64_t C, int64_t ldd, int64_t ldi) = nullptr;
  void (*swiglu_backward)(const ExecContext& ctx, float* dgate, float* dup, const float* dout,
                          const float* gate, const float* up, int64_t N, int64_t F,
                          int64_t ldg) = nullptr;
  void (*layernorm)(const ExecContext& ctx, float* out, const float* inp, const float* w,
                    const float* b, int64_t N, int64_t C, float eps) = nullptr;
  void (*polynorm)(const ExecContext& ctx, float* out, const float* gate, const float* up, int64_t N,
                   int64_t F, int64_t ldg, const float* w, const float* b, float eps) = nullptr;
};

const OpTable& reference_ops();
const OpTable& cpu_ops();

// What a runner holds and every layer body receives: the table its ops go to and the device
// its tensors live on (a CUDA context would add its stream here). The methods check that the
// table provides the op (an InvalidArgument naming the backend and the op otherwise) and call it.
struct ExecContext {
  const OpTable* ops = &cpu_ops();

  bool supports(Op op, DType t = DType::F32) const;
  // Throws InvalidArgument "backend NAME does not support OP (DTYPE)" unless supports(op, t);
  // `what` names the caller (a runner checks its model's ops once, at construction).
  void require(Op op, DType t, const char* what) const;

  void attention(const kernels::AttnParams& p) const;
  void attention_backward(const kernels::AttnBwdParams& p) const;
  void paged_attention(const kernels::PagedAttnParams& p) const;
  // The few-row product for N <= few_rows_max(w.dtype), the many-row one above it.
  void linear(float* out, const float* inp, const TensorView& w, int64_t N, int64_t C, int64_t OC,
              int64_t ldo = 0) const;
  void rmsnorm(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
               float eps, int64_t ldi = 0, int64_t ldo = 0) const;
  void rope(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t nh,
            int64_t D, int64_t ld, int64_t lb, bool inverse) const;
  void swiglu(float* out, const float* gate, const float* up, int64_t N, int64_t F,
              int64_t ldg = 0) const;
  // The training backward's products, norms and SwiGLU (nn::linear_bwd, rmsnorm_bwd,
  // swiglu_bwd's contracts; RoPE's backward is rope(..., inverse = true)).
  void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, int64_t N, int64_t C, int64_t OC, int64_t ldd = 0,
                       bool dinp_overwrite = false) const;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int64_t N, int64_t C,
                        int64_t ldd = 0, int64_t ldi = 0) const;
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int64_t N, int64_t F, int64_t ldg = 0) const;
  // The other families' norms (nn::layernorm_fwd, nn::polynorm_fwd's contracts).
  void layernorm(float* out, const float* inp, const float* w, const float* b, int64_t N, int64_t C,
                 float eps) const;
  void polynorm(float* out, const float* gate, const float* up, int64_t N, int64_t F, int64_t ldg,
                const float* w, const float* b, float eps) const;
};

// The contexts of the two tables on the host.
const ExecContext& cpu_context();
const ExecContext& reference_context();
// kernels::Backend onto a context: Reference -> reference_context(), Auto/Fused -> cpu_context().
const ExecContext& context_for(kernels::Backend b);
// "cpu" or "reference" (a table's name) onto its context; anything else is an InvalidArgument
// naming `where` and the accepted names.
const ExecContext& context_named(const std::string& name, const std::string& where);

}  // namespace diffattn::nn
