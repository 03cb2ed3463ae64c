// The layers of the Differential Transformer as forward/backward pairs (docs/DESIGN.md, layer
// `nn`). Argument order everywhere: outputs, saved statistics, inputs, weights, sizes
// (docs/STYLE.md item 2). Every backward accumulates (+=) into its gradients, input gradients
// included, so residual branches and gradient accumulation need no extra buffers; callers zero
// gradient buffers before a step. Rows are independent and parallelised over num_threads();
// nothing reduces across threads, so results do not depend on the thread count except
// through BLAS (OpenBLAS is deterministic for a fixed thread count).
#pragma once

#include <cstdint>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/base/tensor.h"

#include "diffattn/kernels/attention.h"

namespace diffattn::nn {

// Loops over fewer elements than this run on one thread: below it a parallel region's start and
// barrier cost more than the work, and far more when another process holds a core.
inline constexpr int64_t kParallelMin = 1 << 15;

// ---- linear (BLAS sgemm) ----
// out (N, OC) = inp (N, C) @ weight^T, weight (OC, C) as PyTorch stores nn.Linear.
// ldo: out's row stride (>= OC), so the output may be a column block of a wider buffer.
// N == 1: sgemv; 2 <= N <= kGemvMaxN (a served decode step's rows): a multi-row
// matrix-vector kernel that reads each weight row once for all N rows (sgemm would copy the
// whole weight into its packed layout on every call); larger N: sgemm.
// At 16 and 32 served streams of a 1B BF16 model the multi-row kernel's decode steps took 0.54x
// and 0.67x the time of widened panels + sgemm (inter-token p50 498 vs 929 ms, 897 vs 1338 ms;
// docs/PERFORMANCE.md, "Serving"). The bounds are where sgemm catches up (bench_linear_lowp,
// Zen 4, 2 threads, the 1B shape's 8192 x 2048 and 2048 x 8192): float32 weights 1.8x sgemm at
// N = 16, 1.0x at 64, 0.85x at 128; BF16/F16 weights 1.5x at 64, 1.25x at 128, while the widened
// panels + sgemm reach 0.87-0.97x at 256.
inline constexpr int64_t kGemvMaxN = 32;
inline constexpr int64_t kGemvMaxN16 = 128;  // BF16 / F16 weights
void linear_fwd(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                int64_t OC, int64_t ldo = 0);
// The same product with weight (OC, C) row-major in weight.dtype, accumulated in float32
// (src/nn/linear_lowp.cpp). F32 goes to the overload above (bit-identical). BF16/F16: for
// N <= kGemvMaxN16 the multi-row matrix-vector kernel, which reads (and widens) each weight
// once per call for all N rows; above it, panels of the weight widened to float32 in
// per-thread scratch and multiplied by sgemm (prefill is compute-bound).
void linear_fwd(float* out, const float* inp, TensorView weight, int64_t N, int64_t C, int64_t OC,
                int64_t ldo = 0);
// dinp (N, C) += dout @ weight; dweight (OC, C) += dout^T @ inp. dinp may be null (skipped).
// ldd: dout's row stride. dinp_overwrite: dinp = dout @ weight instead (a fresh buffer needs no
// zeroing first).
void linear_bwd(float* dinp, float* dweight, const float* dout, const float* inp,
                const float* weight, int64_t N, int64_t C, int64_t OC, int64_t ldd = 0,
                bool dinp_overwrite = false);

// out (N, OC) [row stride ldo, 0: OC] += bias (OC) on every row.
void bias_add(float* out, const float* bias, int64_t N, int64_t OC, int64_t ldo = 0);

// ---- embedding ----
// out (N, C) = table[tokens]; tokens checked against V.
void embedding_fwd(float* out, const int32_t* tokens, const float* table, int64_t N, int64_t C,
                   int64_t V);
// The same gather from a table (V, C) in table.dtype, rows widened to float32.
void embedding_fwd(float* out, const int32_t* tokens, TensorView table, int64_t N, int64_t C,
                   int64_t V);
// dtable (V, C) += scatter of dout (N, C) (serial over rows: tokens repeat).
void embedding_bwd(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                   int64_t C);

// ---- RMSNorm ----
// out (N, C) = inp / sqrt(mean(inp^2) + eps) * weight; rstd (N) saved. Input and output rows
// may be strided (ldi, ldo; 0 means C).
void rmsnorm_fwd(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                 int64_t C, float eps, int64_t ldi = 0, int64_t ldo = 0);
// dinp (N, C) += ..., dweight (C) += ...; rows of dout may be strided (ldd). dweight's sum over
// rows is taken per thread block in a fixed order (deterministic).
void rmsnorm_bwd(float* dinp, float* dweight, const float* dout, const float* inp,
                 const float* weight, const float* rstd, int64_t N, int64_t C, int64_t ldd = 0,
                 int64_t ldi = 0);

// ---- interleaved RoPE ----
// Frequency scaling of long-context checkpoints (Hugging Face's rope_scaling / rope_parameters).
struct RopeScaling {
  enum class Type { None, Linear, Llama3 };
  Type type = Type::None;
  double factor = 1.0;           // Linear, Llama3: low frequencies divided by it
  double low_freq_factor = 1.0;  // Llama3
  double high_freq_factor = 4.0;  // Llama3
  int64_t original_max_position_embeddings = 8192;  // Llama3: the pre-training context
  bool operator==(const RopeScaling&) const = default;
};
const char* rope_type_name(RopeScaling::Type t);  // "default", "linear", "llama3"
// theta_j = base^(-2j/D) for j < D/2, then scaled: Linear divides every theta_j by factor;
// Llama3 divides the frequencies whose wavelength 2 pi / theta_j exceeds original / low_freq_factor
// by factor, keeps those under original / high_freq_factor, and blends linearly in
// original / wavelength between the two (Llama 3.1's rule).
std::vector<double> rope_inv_freq(int64_t D, double base, const RopeScaling& scaling = {});
// Angle table for positions [pos0, pos0 + T): cos/sin (T, D/2) of (pos0 + t) * inv_freq[j],
// inv_freq (D/2) from rope_inv_freq.
void rope_table(float* cos_t, float* sin_t, int64_t pos0, int64_t T, int64_t D,
                const std::vector<double>& inv_freq);
// The unscaled table, theta_j = base^(-2j/D).
void rope_table(float* cos_t, float* sin_t, int64_t pos0, int64_t T, int64_t D, double base);
// In place on x (B, T, nh, D) with row stride ld (elements between consecutive t) and batch
// stride lb: u'[2j] = u[2j] c - u[2j+1] s, u'[2j+1] = u[2j] s + u[2j+1] c. inverse = true
// rotates by -angle: the backward of the forward rotation (it is orthogonal).
void rope_apply(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T,
                int64_t nh, int64_t D, int64_t ld, int64_t lb, bool inverse);

// ---- SwiGLU ----
// out (N, F) = silu(gate) * up; gate and up may be column blocks of one buffer (ldg).
void swiglu_fwd(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                int64_t ldg = 0);
// dgate, dup (N, F) += ... (same strides as gate/up).
// Motif-2's PolyNorm gate (arXiv:2411.03884): out (N, F) = (w0 n(z^3) + w1 n(z^2) + w2 n(z) + b)
// * up, z = gate, n(u) = u / sqrt(mean(u^2) + eps) over each row (the means in double);
// gate and up rows ldg apart (0: F). w (3), b (1). Inference only (no backward).
void polynorm_fwd(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                  int64_t ldg, const float* w, const float* b, float eps);
void swiglu_bwd(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                int64_t N, int64_t F, int64_t ldg = 0);

// ---- sigmoid (V2's per-token lambda) ----
// out (N, H) contiguous = sigmoid(inp), inp rows strided by ldi.
void sigmoid_fwd(float* out, const float* inp, int64_t N, int64_t H, int64_t ldi);
// dinp (rows strided ldi) += dout * out * (1 - out).
void sigmoid_bwd(float* dinp, const float* dout, const float* out, int64_t N, int64_t H,
                 int64_t ldi);

// ---- cross-entropy ----
// losses (N) = lse(logits_i) - logits_i[target_i]; lse (N) saved. Targets checked against V;
// a target < 0 is ignored (loss 0, no gradient).
void cross_entropy_fwd(float* losses, float* lse, const float* logits, const int32_t* targets,
                       int64_t N, int64_t V);
// dlogits (N, V) = dloss * (softmax(logits) - onehot(target)), written (not accumulated), may
// alias logits.
void cross_entropy_bwd(float* dlogits, const float* logits, const float* lse,
                       const int32_t* targets, float dloss, int64_t N, int64_t V);

// Sets OpenBLAS's thread count to num_threads() (called before BLAS work).
void sync_blas_threads();

}  // namespace diffattn::nn
