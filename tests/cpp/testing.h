// Test helpers: seeded random tensors, one-call forward/backward runners over owned buffers,
// and comparisons with error measures relative to the size of the values.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "diffattn/kernels/attention.h"

namespace diffattn::testing {

inline std::vector<float> randn(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A differential (maps == 2) or standard (maps == 1) attention problem with owned tensors.
struct Problem {
  int64_t B = 1, Tq = 4, Tk = 4, H = 2, G = 1, D = 8, Dv = 16;
  int maps = 2;
  bool shared_keys = false, lam_per_token = false, causal = false;
  bool lam_scalar = false;  // lam (1): one lambda for every pair
  int64_t noise_share = 1;  // pairs sharing one noise map (AttnProblem::noise_share)
  float scale = 0.0f;
  kernels::DiffMode mode = kernels::DiffMode::Signed;
  std::vector<float> q, k, v, lam;

  Shape q_shape() const { return {B, Tq, maps * H, D}; }
  Shape k_shape() const { return {B, Tk, (maps == 2 && !shared_keys) ? 2 * G : G, D}; }
  Shape v_shape() const { return {B, Tk, G, Dv}; }
  Shape lam_shape() const {
    return lam_per_token ? Shape{B, Tq, H} : lam_scalar ? Shape{1} : Shape{H};
  }

  // Fills q, k, v with N(0, 1) and lam uniform in [lam_lo, lam_hi].
  void randomize(uint32_t seed, float lam_lo = 0.1f, float lam_hi = 0.9f) {
    q = randn(numel(q_shape()), seed);
    k = randn(numel(k_shape()), seed + 1);
    v = randn(numel(v_shape()), seed + 2);
    std::mt19937 rng(seed + 3);
    std::uniform_real_distribution<float> u(lam_lo, lam_hi);
    lam.resize(static_cast<size_t>(numel(lam_shape())));
    for (float& x : lam) x = u(rng);
  }

  kernels::AttnParams params() const {
    kernels::AttnOptions o;
    o.causal = causal;
    o.scale = scale;
    o.mode = mode;
    if (maps == 2) {
      kernels::AttnParams p = kernels::diff_attn_params({q.data(), q_shape()}, {k.data(), k_shape()},
                                      {v.data(), v_shape()}, {lam.data(), lam_shape()}, o);
      p.noise_share = noise_share;
      return p;
    }
    return kernels::attn_params({q.data(), q_shape()}, {k.data(), k_shape()}, {v.data(), v_shape()}, o);
  }
};

struct FwdResult {
  std::vector<float> out, lse, o2;
};

inline FwdResult run_fwd(const Problem& pr, kernels::Backend backend = kernels::Backend::Reference) {
  kernels::AttnParams p = pr.params();
  FwdResult r;
  r.out.assign(static_cast<size_t>(p.numel(p.out_shape())), NAN);
  r.lse.assign(static_cast<size_t>(p.numel(p.lse_shape())), NAN);
  p.out = r.out.data();
  p.lse = r.lse.data();
  if (p.maps == 2) {
    r.o2.assign(r.out.size(), NAN);
    p.o2 = r.o2.data();
  }
  kernels::attention_fwd(p, backend);
  return r;
}

struct BwdResult {
  std::vector<float> dq, dk, dv, dlam;
};

// Backend::Reference runs the oracle (attention_bwd_oracle) unless as_backend: then the
// reference backend itself (attention_bwd), e.g. to compare two ways of calling one backend.
inline BwdResult run_bwd(const Problem& pr, const std::vector<float>& dout,
                         kernels::Backend backend = kernels::Backend::Reference, bool as_backend = false) {
  FwdResult f = run_fwd(pr, backend);
  kernels::AttnBwdParams p(pr.params());
  p.out = f.out.data();
  p.lse = f.lse.data();
  p.o2 = pr.maps == 2 ? f.o2.data() : nullptr;
  p.dout = dout.data();
  BwdResult r;
  r.dq.assign(pr.q.size(), NAN);
  r.dk.assign(pr.k.size(), NAN);
  r.dv.assign(pr.v.size(), NAN);
  p.dq = r.dq.data();
  p.dk = r.dk.data();
  p.dv = r.dv.data();
  if (pr.maps == 2) {
    r.dlam.assign(pr.lam.size(), NAN);
    p.dlam = r.dlam.data();
  }
  // The reference side of a comparison is the oracle, which recomputes the maps rather than
  // trusting the saved lse (Backend::Reference's backward honours it, as every backend does).
  if (backend == kernels::Backend::Reference && !as_backend) {
    kernels::attention_bwd_oracle(p);
  } else {
    kernels::attention_bwd(p, backend);
  }
  return r;
}

// Largest |a - b| over max(|b|) (a relative error of the whole tensor, not of each entry).
inline double rel_max_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

inline bool all_finite(const std::vector<float>& x) {
  for (float v : x) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace diffattn::testing
