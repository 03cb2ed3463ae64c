// Row addressing shared by the kernels: where row t of head x of each tensor starts, which
// sub-head and key head map m of pair h reads, and the lambda of a (batch, row, pair).
#pragma once

#include <cstdint>

#include "diffattn/kernels/attention.h"

namespace diffattn::kernels {

struct Rows {
  const AttnProblem& p;
  float* out_ = nullptr;         // a forward's out (written)
  const float* saved_ = nullptr;  // out as the backward reads it
  const float* dout_ = nullptr;  // set for a backward

  explicit Rows(const AttnProblem& params) : p(params) {}
  explicit Rows(const AttnParams& params) : p(params), out_(params.out), saved_(params.out) {}
  explicit Rows(const AttnBwdParams& params)
      : p(params), saved_(params.out), dout_(params.dout) {}

  // Key/value group of pair (or head) h: GQA at the pair level.
  int64_t group(int64_t h) const { return h / p.group_size(); }
  // Query sub-head of map m of pair h: 2h (map 1) and 2h+1 (map 2); h for standard.
  int64_t q_head(int64_t h, int m) const { return p.maps == 2 ? 2 * h + m : h; }
  // Key head of map m of pair h: 2g+m with separate keys (V1), g when shared (V2) or standard.
  int64_t key_head(int64_t h, int m) const {
    const int64_t g = group(h);
    return (p.maps == 2 && !p.shared_keys) ? 2 * g + m : g;
  }

  const float* q(int64_t b, int64_t t, int64_t head) const {
    return p.q + b * p.q_batch_stride + t * p.q_row_stride + head * p.q_head_stride;
  }
  const float* k(int64_t b, int64_t t, int64_t head) const {
    return p.kf() + b * p.k_batch_stride + t * p.k_row_stride + head * p.k_head_stride;
  }
  const float* v(int64_t b, int64_t t, int64_t g) const {
    return p.vf() + b * p.v_batch_stride + t * p.v_row_stride + g * p.v_head_stride;
  }
  float* out(int64_t b, int64_t t, int64_t h) const {
    return out_ + b * p.o_batch_stride + t * p.o_row_stride + h * p.o_head_stride;
  }
  const float* saved_out(int64_t b, int64_t t, int64_t h) const {
    return saved_ + b * p.o_batch_stride + t * p.o_row_stride + h * p.o_head_stride;
  }
  const float* dout(int64_t b, int64_t t, int64_t h) const {
    return dout_ + b * p.o_batch_stride + t * p.o_row_stride + h * p.o_head_stride;
  }
  // lse is (B, maps*H, Tq), indexed by query sub-head.
  int64_t lse_index(int64_t b, int64_t qh, int64_t t) const {
    return (b * p.q_heads() + qh) * p.Tq + t;
  }
  // o2 is contiguous (B, Tq, H, Dv).
  int64_t o2_index(int64_t b, int64_t t, int64_t h) const {
    return ((b * p.Tq + t) * p.H + h) * p.Dv;
  }
  float lam(int64_t b, int64_t t, int64_t h) const {
    return p.lam_per_token ? p.lam[(b * p.Tq + t) * p.H + h] : p.lam[p.lam_scalar ? 0 : h];
  }
};

}  // namespace diffattn::kernels
