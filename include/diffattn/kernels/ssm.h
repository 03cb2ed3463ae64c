// Mamba-1's sequence kernels (the SambaY hybrid, docs/models/phi4flash.md "The blocks"): the
// selective scan and the depthwise causal conv1d + SiLU, each over T tokens of one sequence that
// continue from its state (decode is T = 1, a chunked prefill any T). One params struct per
// operator, checked in one place; a reference oracle beside the fused (Highway SIMD) kernels.
#pragma once

#include <cstdint>

#include "diffattn/kernels/attention.h"  // Backend

namespace diffattn::kernels {

// Mamba-1's selective scan (mamba_ssm selective_scan_fn with delta_softplus=True) over T tokens of
// one sequence, continuing state h:
//   dt[t,e] = softplus(delta[t,e] + delta_bias[e])
//             (softplus(x) = x for x > 20, log1p(exp(x)) otherwise)
//   h[e,n]  = exp(dt[t,e] * A[e,n]) * h[e,n] + dt[t,e] * Bm[t,n] * u[t,e]
//   y[t,e]  = sum_n h[e,n] * Cm[t,n] + D[e] * u[t,e]
//   if z: y[t,e] *= silu(z[t,e])       (y_pre, when not null, receives y before the gate)
// exp(dt A) is the zero-order hold of A (arXiv:2312.00752, Eq. 4), dt B u Euler's for B, as in
// mamba_ssm's kernels. h is float32 and rounded once per token, so T calls of one token equal
// one call of T (bit for bit, per backend and SIMD target). The outputs never alias the inputs
// or each other. T = 0 is a no-op.
struct ScanParams {
  int64_t T = 0, E = 0, N = 0;
  const float* u = nullptr;      int64_t u_stride = 0;      // (T, E) rows
  const float* delta = nullptr;  int64_t delta_stride = 0;  // (T, E) dt_proj(dt_r) without its bias
  const float* delta_bias = nullptr;                         // (E)
  const float* A = nullptr;                                  // (E, N) = -exp(A_log), row-major
  const float* Bm = nullptr;     int64_t b_stride = 0;      // (T, N)
  const float* Cm = nullptr;     int64_t c_stride = 0;      // (T, N)
  const float* D = nullptr;                                  // (E)
  const float* z = nullptr;      int64_t z_stride = 0;      // (T, E) or null: no gate
  float* h = nullptr;                                        // (E, N) in/out, float32
  float* y = nullptr;            int64_t y_stride = 0;      // (T, E) out
  float* y_pre = nullptr;        int64_t y_pre_stride = 0;  // (T, E) or null: y before the gate
};
// Backend::Auto and Fused run the SIMD kernel (vectors over n, one channel's h row at a time,
// channel blocks over the library's threads when T * E * N is large); Reference the oracle.
void selective_scan(const ScanParams& p, Backend backend = Backend::Auto);
// The oracle: plain loops, each token's dt, exp(dt A), h and the dot over n in double, h rounded
// to float32 after every token (the state's storage type).
void selective_scan_ref(const ScanParams& p);

// Mamba-1's depthwise causal conv1d + SiLU over T tokens of one sequence, continuing from the last
// K-1 inputs (state):
//   out[t,e] = silu(bias[e] + sum_{k<K} w[k,e] * xin[t-(K-1)+k, e]),
//              xin[s] for s<0 = state row (K-1+s)
//   afterwards state holds the last K-1 inputs (oldest first), mixing old state and new rows
//   when T < K-1.
// A fresh sequence starts from a zero state (the conv's zero padding). out never aliases x or
// state. K = 1 has no state (state may be null). T = 0 is a no-op.
struct ConvParams {
  int64_t T = 0, E = 0, K = 0;
  const float* x = nullptr;   int64_t x_stride = 0;    // (T, E) the conv inputs
  // (K, E): tap k of channel e at w[k*E+e] (transposed from the published (E,1,K) at load time)
  const float* w = nullptr;
  const float* bias = nullptr;                          // (E)
  float* state = nullptr;                               // (K-1, E) in/out, oldest row first
  float* out = nullptr;       int64_t out_stride = 0;  // (T, E) silu(conv)
};
void causal_conv1d_silu(const ConvParams& p, Backend backend = Backend::Auto);
// The oracle: the sum of the taps and the SiLU in double.
void causal_conv1d_silu_ref(const ConvParams& p);

// Checks a filled params struct before a kernel reads it (O(1), reads no tensor data): sizes
// (T >= 0; E >= 1; N in 1..256; K in 1..16), null pointers, row strides (at least the row's
// width when T > 1), and that no output overlaps an input or another output. Throws
// InvalidArgument "<op>: <field> ..." naming the field. Every entry point calls it.
void check_params(const ScanParams& p, const char* op);
void check_params(const ConvParams& p, const char* op);

}  // namespace diffattn::kernels
