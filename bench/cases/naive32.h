// A naive float32 formulation of the operator family (materialise both maps in float,
// subtract, multiply; the chain rule in float). It is not an oracle: the tests measure its
// error against the reference (double accumulation) to set tolerances relative to what plain
// float32 arithmetic gets wrong on the same inputs, rather than one flat number.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "diffattn/kernels/attention.h"
#include "kernels/indexing.h"

namespace diffattn::bench {

// One row's softmax over its n visible keys, in float; probs sized Tk (zeros beyond n).
inline void naive_row(const kernels::Rows& r, int64_t b, int64_t i, int64_t h, int m, int64_t n,
                      std::vector<float>& probs) {
  const kernels::AttnProblem& p = r.p;
  probs.assign(static_cast<size_t>(p.Tk), 0.0f);
  if (n <= 0) return;
  const float* qi = r.q(b, i, r.q_head(h, m));
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = r.k(b, j, r.key_head(h, m));
    float s = 0;
    for (int64_t d = 0; d < p.D; ++d) s += qi[d] * kj[d];
    probs[j] = s * p.scale;
    mx = std::max(mx, probs[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (probs[j] = std::exp(probs[j] - mx));
  for (int64_t j = 0; j < n; ++j) probs[j] /= sum;
}

inline int64_t naive_visible(const kernels::AttnParams& p, int64_t i) {
  return std::max<int64_t>(0, std::min(p.last_key(i) + 1, p.Tk));
}

// out (B, Tq, H, Dv) contiguous.
inline std::vector<float> naive_fwd(const kernels::AttnParams& p) {
  const kernels::Rows r(p);
  std::vector<float> out(static_cast<size_t>(p.B * p.Tq * p.H * p.Dv), 0.0f), p1, p2;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.Tq; ++i) {
        const int64_t n = naive_visible(p, i);
        naive_row(r, b, i, h, 0, n, p1);
        std::vector<float> w = p1;
        if (p.maps == 2) {
          naive_row(r, b, i, h, 1, n, p2);
          const float lam = r.lam(b, i, h);
          float sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            w[j] = p1[j] - lam * p2[j];
            if (p.mode == kernels::DiffMode::Clamp) sum += (w[j] = std::max(w[j], 0.0f));
          }
          if (p.mode == kernels::DiffMode::Clamp)
            for (int64_t j = 0; j < n; ++j) w[j] = sum > 0 ? w[j] / sum : 0.0f;
        }
        float* o = &out[static_cast<size_t>(((b * p.Tq + i) * p.H + h) * p.Dv)];
        for (int64_t j = 0; j < n; ++j)
          for (int64_t d = 0; d < p.Dv; ++d) o[d] += w[j] * r.v(b, j, r.group(h))[d];
      }
  return out;
}

// Gradients in float, each contiguous with its input's shape: dq, dk, dv, dlam.
struct NaiveGrads {
  std::vector<float> dq, dk, dv, dlam;
};

inline NaiveGrads naive_bwd(const kernels::AttnParams& p, const float* dout /* (B, Tq, H, Dv) */) {
  const kernels::Rows r(p);
  const int64_t kh_n = p.key_heads();
  NaiveGrads g;
  g.dq.assign(static_cast<size_t>(p.B * p.Tq * p.q_heads() * p.D), 0.0f);
  g.dk.assign(static_cast<size_t>(p.B * p.Tk * kh_n * p.D), 0.0f);
  g.dv.assign(static_cast<size_t>(p.B * p.Tk * p.G * p.Dv), 0.0f);
  g.dlam.assign(static_cast<size_t>(p.maps == 2 ? p.numel(p.lam_shape()) : 0), 0.0f);
  std::vector<float> pm[2], dP(static_cast<size_t>(p.Tk));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.Tq; ++i) {
        const int64_t n = naive_visible(p, i), gg = r.group(h);
        for (int m = 0; m < p.maps; ++m) naive_row(r, b, i, h, m, n, pm[m]);
        const float* doi = dout + ((b * p.Tq + i) * p.H + h) * p.Dv;
        for (int64_t j = 0; j < n; ++j) {
          float s = 0;
          for (int64_t d = 0; d < p.Dv; ++d) s += doi[d] * r.v(b, j, gg)[d];
          dP[j] = s;
        }
        const float c = p.maps == 2 ? -r.lam(b, i, h) : 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          const float wj = p.maps == 2 ? pm[0][j] + c * pm[1][j] : pm[0][j];
          float* dvj = &g.dv[static_cast<size_t>(((b * p.Tk + j) * p.G + gg) * p.Dv)];
          for (int64_t d = 0; d < p.Dv; ++d) dvj[d] += wj * doi[d];
        }
        for (int m = 0; m < p.maps; ++m) {
          float rowdot = 0;
          for (int64_t j = 0; j < n; ++j) rowdot += pm[m][j] * dP[j];
          if (m == 1) {
            const size_t li = p.lam_per_token ? static_cast<size_t>((b * p.Tq + i) * p.H + h)
                                              : static_cast<size_t>(h);
            g.dlam[li] -= rowdot;
          }
          const float coef = m == 0 ? 1.0f : c;
          const int64_t qh = r.q_head(h, m), kh = r.key_head(h, m);
          const float* qi = r.q(b, i, qh);
          float* dqi = &g.dq[static_cast<size_t>(((b * p.Tq + i) * p.q_heads() + qh) * p.D)];
          for (int64_t j = 0; j < n; ++j) {
            const float ds = coef * pm[m][j] * (dP[j] - rowdot) * p.scale;
            const float* kj = r.k(b, j, kh);
            float* dkj = &g.dk[static_cast<size_t>(((b * p.Tk + j) * kh_n + kh) * p.D)];
            for (int64_t d = 0; d < p.D; ++d) {
              dqi[d] += ds * kj[d];
              dkj[d] += ds * qi[d];
            }
          }
        }
      }
  return g;
}

}  // namespace diffattn::bench
