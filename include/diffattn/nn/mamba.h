// The layers of Phi-4-mini-flash's SambaY hybrid besides attention (docs/models/phi4flash.md,
// "The blocks"): LayerNorm with bias, the Mamba-1 mixer and the gated memory unit (GMU),
// inference only, over rows grouped into sequences that each continue their own state.
#pragma once

#include <cstdint>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/base/tensor.h"

namespace diffattn::nn {

// out (N, C) = (inp - mean) / sqrt(var + eps) * w + b per row (biased variance; the sums in
// double). out may be inp.
void layernorm_fwd(float* out, const float* inp, const float* w, const float* b, int64_t N,
                   int64_t C, float eps);

struct MambaShape {
  int64_t C = 0;  // d_model
  int64_t E = 0;  // inner width (expand * C)
  int64_t N = 0;  // state size per channel
  int64_t K = 0;  // conv taps
  int64_t R = 0;  // dt rank
};

// A Mamba layer's weights: matrices in their stored type, the rest float32 and already in the
// kernels' form (conv taps (K, E), A = -exp(A_log) (E, N)). A GMU uses in_proj (E, C) and
// out_proj (C, E) only.
struct MambaWeights {
  TensorView in_proj;   // (2E, C) rows [x | z]; GMU: (E, C)
  TensorView x_proj;    // (R + 2N, E) rows [dt | B | C]
  TensorView dt_proj;   // (E, R)
  TensorView out_proj;  // (C, E)
  const float* conv_w = nullptr;   // (K, E)
  const float* conv_b = nullptr;   // (E)
  const float* dt_bias = nullptr;  // (E)
  const float* A = nullptr;        // (E, N)
  const float* D = nullptr;        // (E)
};

// One sequence's rows [row0, row0 + n) of a call and its state: conv (K - 1, E), the last
// K - 1 conv inputs, oldest first; ssm (E, N). Both updated in place.
struct MambaSeq {
  int64_t row0 = 0, n = 0;
  float* conv = nullptr;
  float* ssm = nullptr;
};

struct MambaActs {
  std::vector<float> xz, xc, dbc, dtr, dt, y;
};

// out (N, C) = out_proj(y * silu(z)), y the selective scan of silu(conv1d(x)) per sequence,
// [x | z] = in_proj(inp) (inp normalised). mem (N, E), when not null, receives y before the
// gate (the memory layer's GMU memory).
void mamba_fwd(float* out, MambaActs& a, const float* inp, const MambaWeights& w,
               const MambaShape& s, int64_t N, const std::vector<MambaSeq>& seqs, float* mem);

// out (N, C) = out_proj(silu(in_proj(inp)) * mem), mem (N, E) the memory layer's y of the same
// tokens.
void gmu_fwd(float* out, MambaActs& a, const float* inp, const float* mem, const MambaWeights& w,
             const MambaShape& s, int64_t N);

}  // namespace diffattn::nn
