// Benchmark cases shared by `diffattn bench` and bench/: see bench_cases.h.
#include "bench/cases/bench_cases.h"

#include <unistd.h>

#include <cblas.h>
#include <omp.h>

#include <algorithm>

namespace diffattn::bench {

Tensors::Tensors(const AttnCase& spec, uint32_t seed, bool with_grads) : c(spec) {
  AttnCase c32 = spec;
  c32.kv_dtype = DType::F32;
  CaseInputs in = make_inputs(c32, seed);
  q = std::move(in.q), lam = std::move(in.lam);
  k.assign(in.k.begin(), in.k.end());
  v.assign(in.v.begin(), in.v.end());
  const kernels::AttnProblem sz = c32.sizes();
  kernels::AttnOptions o;
  o.causal = spec.causal;
  o.mode = spec.mode;
  if (spec.maps == 2) {
    p = kernels::diff_attn_params({q.data(), sz.q_shape()}, {k.data(), sz.k_shape()},
                         {v.data(), sz.v_shape()}, {lam.data(), sz.lam_shape()}, o);
  } else {
    p = kernels::attn_params({q.data(), sz.q_shape()}, {k.data(), sz.k_shape()}, {v.data(), sz.v_shape()}, o);
  }
  if (spec.kv_dtype != DType::F32) {
    // Only the 16-bit copies stay (what a 16-bit cache holds); the backward refuses them.
    kv16 = std::make_unique<Kv16>(k, v, spec.kv_dtype, /*keep_rounded=*/false);
    kv16->use_in(p);
    k = {};
    v = {};
    with_grads = false;
  }
  out.resize(static_cast<size_t>(p.numel(p.out_shape())));
  lse.resize(static_cast<size_t>(p.numel(p.lse_shape())));
  if (with_grads) {
    dout = randn(static_cast<int64_t>(out.size()), seed + 3);
    dq.resize(q.size());
    dk.resize(k.size());
    dv.resize(v.size());
  }
  p.out = out.data();
  p.lse = lse.data();
  if (spec.maps == 2) {
    o2.resize(out.size());
    if (with_grads) dlam.resize(lam.size());
    p.o2 = o2.data();
  }
}

kernels::AttnBwdParams Tensors::bwd() {
  kernels::AttnBwdParams b(p);
  b.dout = dout.data();
  b.dq = dq.data();
  b.dk = dk.data();
  b.dv = dv.data();
  b.dlam = c.maps == 2 ? dlam.data() : nullptr;
  return b;
}

UpstreamRecipe::UpstreamRecipe(Tensors& t) : t_(t) {
  const kernels::AttnParams& p = t.p;
  const int64_t nq = p.B * p.Tq * p.H * p.D, nk = p.B * p.Tk * p.G * p.D,
                no = p.B * p.Tq * p.H * p.Dv;
  for (auto* x : {&q1, &q2, &dq1, &dq2}) x->resize(static_cast<size_t>(nq));
  for (auto* x : {&k1, &k2, &dk1, &dk2}) x->resize(static_cast<size_t>(nk));
  for (auto* x : {&o1, &o2, &dout2}) x->resize(static_cast<size_t>(no));
  dv1.resize(t.v.size());
  dv2.resize(t.v.size());
  lse1.resize(static_cast<size_t>(p.B * p.H * p.Tq));
  lse2.resize(lse1.size());
  kernels::AttnOptions o;
  o.causal = p.causal;
  o.scale = p.scale;
  const Shape qs{p.B, p.Tq, p.H, p.D}, ks{p.B, p.Tk, p.G, p.D}, vs{p.B, p.Tk, p.G, p.Dv};
  p1 = kernels::attn_params({q1.data(), qs}, {k1.data(), ks}, {t.v.data(), vs}, o);
  p2 = kernels::attn_params({q2.data(), qs}, {k2.data(), ks}, {t.v.data(), vs}, o);
  p1.out = o1.data();
  p1.lse = lse1.data();
  p2.out = o2.data();
  p2.lse = lse2.data();
}

// q (B, T, 2H, D) -> q1, q2 (B, T, H, D); k (B, T, 2G, D) -> k1, k2 (shared keys: both k).
void UpstreamRecipe::split() {
  const kernels::AttnParams& p = t_.p;
  for (int64_t r = 0; r < p.B * p.Tq * p.H; ++r) {
    std::copy_n(&t_.q[(2 * r) * p.D], p.D, &q1[r * p.D]);
    std::copy_n(&t_.q[(2 * r + 1) * p.D], p.D, &q2[r * p.D]);
  }
  for (int64_t r = 0; r < p.B * p.Tk * p.G; ++r) {
    if (p.shared_keys) {
      std::copy_n(&t_.k[r * p.D], p.D, &k1[r * p.D]);
      std::copy_n(&t_.k[r * p.D], p.D, &k2[r * p.D]);
    } else {
      std::copy_n(&t_.k[(2 * r) * p.D], p.D, &k1[r * p.D]);
      std::copy_n(&t_.k[(2 * r + 1) * p.D], p.D, &k2[r * p.D]);
    }
  }
}

void UpstreamRecipe::forward() {
  split();
  kernels::attention_fwd(p1);
  kernels::attention_fwd(p2);
  const kernels::AttnParams& p = t_.p;
  float* out = t_.out.data();
  for (int64_t r = 0; r < p.B * p.Tq; ++r) {
    for (int64_t h = 0; h < p.H; ++h) {
      const float lam = p.lam_per_token ? t_.lam[r * p.H + h] : t_.lam[h];
      const int64_t o = (r * p.H + h) * p.Dv;
      for (int64_t d = 0; d < p.Dv; ++d) out[o + d] = o1[o + d] - lam * o2[o + d];
    }
  }
}

void UpstreamRecipe::backward() {
  const kernels::AttnParams& p = t_.p;
  // d out / d o1 = dout, d out / d o2 = -lam dout.
  for (int64_t r = 0; r < p.B * p.Tq; ++r) {
    for (int64_t h = 0; h < p.H; ++h) {
      const float lam = p.lam_per_token ? t_.lam[r * p.H + h] : t_.lam[h];
      const int64_t o = (r * p.H + h) * p.Dv;
      for (int64_t d = 0; d < p.Dv; ++d) dout2[o + d] = -lam * t_.dout[o + d];
    }
  }
  kernels::AttnBwdParams b1(p1), b2(p2);
  b1.dout = t_.dout.data();
  b1.dq = dq1.data(), b1.dk = dk1.data(), b1.dv = dv1.data();
  b2.dout = dout2.data();
  b2.dq = dq2.data(), b2.dk = dk2.data(), b2.dv = dv2.data();
  kernels::attention_bwd(b1);
  kernels::attention_bwd(b2);
}

double sgemm_gflops(int64_t n, int threads) {
  static std::vector<float> a, b, c;
  const size_t nn = static_cast<size_t>(n * n);
  if (a.size() != nn) {
    a = randn(n * n, 5);
    b = randn(n * n, 6);
    c.assign(nn, 0.0f);
  }
  openblas_set_num_threads(threads);
  const int N = static_cast<int>(n);
  const double s = seconds_of([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a.data(), N, b.data(),
                N, 0.0f, c.data(), N);
  });
  return 2.0 * static_cast<double>(n) * n * n / s * 1e-9;
}

ReadBandwidth::ReadBandwidth(int64_t bytes) : buf_(static_cast<size_t>(bytes / 4), 1.0f) {}

void ReadBandwidth::evict_caches() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const int64_t want = l3 > 0 ? 2 * static_cast<int64_t>(l3) : int64_t{64} << 20;
  const size_t n = std::min(buf_.size(), static_cast<size_t>(want / 4));
  volatile float sink = 0;
  float acc = 0;
  for (size_t i = 0; i < n; i += 16) acc += buf_[i];  // one float per 64-byte line
  sink = acc;
  (void)sink;
}

double ReadBandwidth::measure(int threads) {
  const int64_t n = static_cast<int64_t>(buf_.size());
  const float* x = buf_.data();
  double total = 0;
  const double s = seconds_of([&] {
    // Eight independent sums per thread so the loop is bound by loads, not by add latency.
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
    for (int64_t i = 0; i < n / 64; ++i) {
      float acc[16] = {};
      for (int j = 0; j < 64; j += 16)
        for (int u = 0; u < 16; ++u) acc[u] += x[i * 64 + j + u];
      float s = 0;
      for (float a : acc) s += a;
      total += s;
    }
  });
  if (total < 0) return 0;  // keeps the sum alive; the buffer holds ones
  return static_cast<double>(n) * 4.0 / s * 1e-9;
}

}  // namespace diffattn::bench
