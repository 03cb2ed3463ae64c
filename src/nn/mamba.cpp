// LayerNorm, the Mamba-1 mixer and the gated memory unit of the SambaY hybrid (nn/mamba.h):
// the projections are products over all the call's rows (each weight read once), the conv and
// the scan run per sequence on its own state (kernels/ssm.h).
#include "diffattn/nn/mamba.h"

#include <cmath>
#include <cstring>

#include "diffattn/base/error.h"
#include "diffattn/kernels/ssm.h"
#include "diffattn/nn/layers.h"
#include "nn/fastmath.h"

namespace diffattn::nn {

void layernorm_fwd(float* out, const float* inp, const float* w, const float* b, int64_t N,
                   int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    float* o = out + i * C;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const double mean = s / static_cast<double>(C);
    double v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (x[c] - mean) * (x[c] - mean);
    const float m = static_cast<float>(mean);
    const float r = static_cast<float>(1.0 / std::sqrt(v / static_cast<double>(C) + eps));
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * r * w[c] + b[c];
  }
}

void mamba_fwd(float* out, MambaActs& a, const float* inp, const MambaWeights& w,
               const MambaShape& s, int64_t N, const std::vector<MambaSeq>& seqs, float* mem) {
  const int64_t E = s.E, NB = s.R + 2 * s.N;
  a.xz.resize(static_cast<size_t>(N * 2 * E));
  a.xc.resize(static_cast<size_t>(N * E));
  a.dbc.resize(static_cast<size_t>(N * NB));
  a.dtr.resize(static_cast<size_t>(N * s.R));
  a.dt.resize(static_cast<size_t>(N * E));
  a.y.resize(static_cast<size_t>(N * E));
  linear_fwd(a.xz.data(), inp, w.in_proj, N, s.C, 2 * E);
  for (const MambaSeq& q : seqs) {  // u = silu(conv1d(x)), each sequence from its conv state
    kernels::ConvParams c;
    c.T = q.n, c.E = E, c.K = s.K;
    c.x = a.xz.data() + q.row0 * 2 * E, c.x_stride = 2 * E;
    c.w = w.conv_w, c.bias = w.conv_b, c.state = q.conv;
    c.out = a.xc.data() + q.row0 * E, c.out_stride = E;
    kernels::causal_conv1d_silu(c);
  }
  linear_fwd(a.dbc.data(), a.xc.data(), w.x_proj, N, E, NB);
  for (int64_t i = 0; i < N; ++i) {
    std::memcpy(&a.dtr[static_cast<size_t>(i * s.R)], &a.dbc[static_cast<size_t>(i * NB)],
                sizeof(float) * static_cast<size_t>(s.R));
  }
  linear_fwd(a.dt.data(), a.dtr.data(), w.dt_proj, N, s.R, E);
  for (const MambaSeq& q : seqs) {
    kernels::ScanParams p;
    p.T = q.n, p.E = E, p.N = s.N;
    p.u = a.xc.data() + q.row0 * E, p.u_stride = E;
    p.delta = a.dt.data() + q.row0 * E, p.delta_stride = E;
    p.delta_bias = w.dt_bias, p.A = w.A, p.D = w.D;
    p.Bm = a.dbc.data() + q.row0 * NB + s.R, p.b_stride = NB;
    p.Cm = a.dbc.data() + q.row0 * NB + s.R + s.N, p.c_stride = NB;
    p.z = a.xz.data() + q.row0 * 2 * E + E, p.z_stride = 2 * E;
    p.h = q.ssm;
    p.y = a.y.data() + q.row0 * E, p.y_stride = E;
    if (mem) p.y_pre = mem + q.row0 * E, p.y_pre_stride = E;
    kernels::selective_scan(p);
  }
  linear_fwd(out, a.y.data(), w.out_proj, N, E, s.C);
}

void gmu_fwd(float* out, MambaActs& a, const float* inp, const float* mem, const MambaWeights& w,
             const MambaShape& s, int64_t N) {
  const int64_t E = s.E;
  a.xc.resize(static_cast<size_t>(N * E));
  a.y.resize(static_cast<size_t>(N * E));
  linear_fwd(a.xc.data(), inp, w.in_proj, N, s.C, E);
  // GMU (arXiv:2507.06607) with sigma = SiLU: silu(in_proj x) * m, SwiGLU's arithmetic
  swiglu_fwd(a.y.data(), a.xc.data(), mem, N, E, 0);
  linear_fwd(out, a.y.data(), w.out_proj, N, E, s.C);
}

}  // namespace diffattn::nn
