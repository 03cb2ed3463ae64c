// Mamba-1's selective scan and causal conv1d + SiLU (kernels/ssm.h): the reference and every SIMD
// target against a float64 loop written here, over awkward shapes, strided rows, chunked calls,
// softplus's linear branch and bad params. The accuracy rule is the project's 16-bit one
// (bench/cases/attn_case.h, dtype_bound): a result may be at most 2x as wrong (against float64)
// as a plain float32 computation of the same thing, also written here, plus a few eps of the
// values' size: 8 rather than that rule's 32 (the kernels need under 2.3 on these cases, and 8
// still catches B perturbed by 1e-6 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "diffattn/kernels/runtime.h"
#include "diffattn/kernels/ssm.h"
#include "simd_targets.h"

namespace diffattn {
namespace {

constexpr double kEps32 = 1.1920928955078125e-07;

std::vector<float> normal(int64_t n, std::mt19937& rng, float mean = 0.0f, float sd = 1.0f) {
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<float> uniform(int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

// got and naive (float32) against truth (float64): max |got - truth| <= 2 max |naive - truth|
// + 8 eps max |truth|; NaN anywhere fails.
::testing::AssertionResult within_rule(const std::string& name, const std::vector<float>& got,
                                       const std::vector<double>& truth,
                                       const std::vector<float>& naive) {
  if (got.size() != truth.size() || naive.size() != truth.size()) {
    return ::testing::AssertionFailure() << name << ": sizes differ";
  }
  double err = 0, naive_err = 0, scale = 0;
  size_t worst = 0;
  for (size_t i = 0; i < truth.size(); ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - truth[i]);
    if (!(e <= err)) {
      if (std::isnan(e)) return ::testing::AssertionFailure() << name << ": NaN at " << i;
      err = e, worst = i;
    }
    naive_err = std::max(naive_err, std::abs(static_cast<double>(naive[i]) - truth[i]));
    scale = std::max(scale, std::abs(truth[i]));
  }
  const double bound = 2.0 * naive_err + 8.0 * kEps32 * scale;
  if (err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": max error " << err << " at " << worst << " > bound " << bound
         << " (naive float32 error " << naive_err << ", scale " << scale << ")";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// (rows, width) out of a strided buffer.
std::vector<float> dense(const std::vector<float>& x, int64_t rows, int64_t width, int64_t stride) {
  std::vector<float> d(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + r * stride, width, d.begin() + r * width);
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Selective scan

struct ScanCase {
  int64_t T = 1, E = 1, N = 1;
  bool gate = true, pre = false;
  float delta_mean = 0.0f;  // delta's mean; bias is -7..-1, so 22 puts x = delta + bias around 20
};

std::string name_of(const ScanCase& c) {
  return "T" + std::to_string(c.T) + " E" + std::to_string(c.E) + " N" + std::to_string(c.N) +
         (c.gate ? " z" : "") + (c.pre ? " y_pre" : "") +
         (c.delta_mean != 0 ? " delta_mean " + std::to_string(c.delta_mean) : "");
}

// Inputs as the block lays them out: rows with padding (strides > widths), B and C side by side
// in one x_proj output row as (dtr | B | C), u and z at different strides.
struct ScanData {
  ScanCase c;
  int64_t us, ds, bcs, zs, ys, ps;
  std::vector<float> u, delta, bias, A, bc, D, z, h0;

  ScanData(const ScanCase& sc, uint32_t seed) : c(sc) {
    std::mt19937 rng(seed);
    const int64_t T = c.T, E = c.E, N = c.N;
    us = E + 3, ds = E + 1, bcs = 5 + 2 * N, zs = 2 * E, ys = E + 2, ps = E;
    u = normal(T * us, rng);
    delta = normal(T * ds, rng, c.delta_mean);
    // mamba's dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1]: about -7 .. -2.3
    bias = uniform(E, rng, -7.0f, -1.0f);
    // A = -exp(A_log), A_log = log(1..N) at init (S4D-real), jittered
    A.resize(static_cast<size_t>(E * N));
    std::uniform_real_distribution<float> jitter(-0.5f, 0.5f);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t n = 0; n < N; ++n) {
        A[e * N + n] = -std::exp(std::log(static_cast<float>(n + 1)) + jitter(rng));
      }
    }
    bc = normal(T * bcs, rng);
    D = normal(E, rng);
    z = normal(T * zs, rng, 0.0f, 2.0f);
    h0 = normal(E * N, rng);
  }
  const float* B(int64_t t) const { return bc.data() + t * bcs + 5; }
  const float* C(int64_t t) const { return bc.data() + t * bcs + 5 + c.N; }
};

struct ScanOut {
  std::vector<float> y, y_pre, h;  // y, y_pre strided (ys, ps); h (E, N)
};

ScanOut fresh_out(const ScanData& s) {
  return {std::vector<float>(static_cast<size_t>(s.c.T * s.ys), NAN),
          std::vector<float>(static_cast<size_t>(s.c.T * s.ps), NAN), s.h0};
}

// Tokens [t0, t0 + T) of s as one call on o's buffers.
kernels::ScanParams params_of(const ScanData& s, ScanOut& o, int64_t t0, int64_t T) {
  kernels::ScanParams p;
  p.T = T, p.E = s.c.E, p.N = s.c.N;
  p.u = s.u.data() + t0 * s.us, p.u_stride = s.us;
  p.delta = s.delta.data() + t0 * s.ds, p.delta_stride = s.ds;
  p.delta_bias = s.bias.data();
  p.A = s.A.data();
  p.Bm = s.B(t0), p.b_stride = s.bcs;
  p.Cm = s.C(t0), p.c_stride = s.bcs;
  p.D = s.D.data();
  if (s.c.gate) p.z = s.z.data() + t0 * s.zs, p.z_stride = s.zs;
  p.h = o.h.data();
  p.y = o.y.data() + t0 * s.ys, p.y_stride = s.ys;
  if (s.c.pre) p.y_pre = o.y_pre.data() + t0 * s.ps, p.y_pre_stride = s.ps;
  return p;
}

ScanOut run_scan(const ScanData& s, kernels::Backend backend) {
  ScanOut o = fresh_out(s);
  kernels::selective_scan(params_of(s, o, 0, s.c.T), backend);
  return o;
}

// The scan of s computed in T (dense (T, E) y and y_pre, h (E, N)): double throughout (h too,
// never rounded), or float32 throughout with std:: functions (the plain float32 computation).
template <typename T>
struct Plain {
  std::vector<T> y, y_pre, h;
};

template <typename R>
Plain<R> plain_scan(const ScanData& s) {
  const int64_t T = s.c.T, E = s.c.E, N = s.c.N;
  Plain<R> r;
  r.y.resize(static_cast<size_t>(T * E));
  r.y_pre.resize(static_cast<size_t>(T * E));
  r.h.assign(s.h0.begin(), s.h0.end());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const R x = static_cast<R>(s.delta[t * s.ds + e]) + static_cast<R>(s.bias[e]);
      const R dt = x > R(20) ? x : std::log1p(std::exp(x));
      const R u = s.u[t * s.us + e];
      R y = 0;
      for (int64_t n = 0; n < N; ++n) {
        R& h = r.h[e * N + n];
        h = std::exp(dt * static_cast<R>(s.A[e * N + n])) * h + dt * static_cast<R>(s.B(t)[n]) * u;
        y += h * static_cast<R>(s.C(t)[n]);
      }
      y += static_cast<R>(s.D[e]) * u;
      r.y_pre[t * E + e] = y;
      if (s.c.gate) {
        const R z = s.z[t * s.zs + e];
        y *= z / (R(1) + std::exp(-z));
      }
      r.y[t * E + e] = y;
    }
  }
  return r;
}

// Compares a run of s with the float64 truth under the rule (tr, nv computed once per case).
void expect_scan_ok(const ScanData& s, const ScanOut& got, const Plain<double>& tr,
                    const Plain<float>& nv) {
  const int64_t T = s.c.T, E = s.c.E;
  EXPECT_TRUE(within_rule("y", dense(got.y, T, E, s.ys), tr.y, nv.y));
  EXPECT_TRUE(within_rule("h", got.h, tr.h, nv.h));
  if (s.c.pre) {
    EXPECT_TRUE(within_rule("y_pre", dense(got.y_pre, T, E, s.ps), tr.y_pre, nv.y_pre));
  } else {
    EXPECT_TRUE(std::all_of(got.y_pre.begin(), got.y_pre.end(),
                            [](float v) { return std::isnan(v); }))
        << "y_pre written without being asked for";
  }
  // Padding between rows is never written.
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = E; e < s.ys; ++e) ASSERT_TRUE(std::isnan(got.y[t * s.ys + e])) << "y padding";
  }
}

std::vector<ScanCase> scan_cases() {
  std::vector<ScanCase> cases;
  for (int64_t E : {1, 7, 37, 5120}) {
    for (int64_t N : {1, 5, 16}) {
      for (int64_t T : {1, 2, 3, 33}) {
        for (int g = 0; g < 4; ++g) {
          // the published width with every gate option at N = 16 only: the rest at one option
          if (E == 5120 && N != 16 && g != 3) continue;
          cases.push_back({T, E, N, (g & 1) != 0, (g & 2) != 0});
        }
      }
    }
  }
  return cases;
}

TEST(SelectiveScan, MatchesFloat64OnEveryTargetAndReference) {
  uint32_t seed = 100;
  for (const ScanCase& c : scan_cases()) {
    SCOPED_TRACE(name_of(c));
    const ScanData s(c, seed++);
    const Plain<double> tr = plain_scan<double>(s);
    const Plain<float> nv = plain_scan<float>(s);
    {
      SCOPED_TRACE("reference");
      expect_scan_ok(s, run_scan(s, kernels::Backend::Reference), tr, nv);
    }
    testing::for_each_target([&] { expect_scan_ok(s, run_scan(s, kernels::Backend::Fused), tr, nv); });
    if (HasFailure()) return;
  }
}

TEST(SelectiveScan, SoftplusLinearBranch) {
  // delta + bias around 20 (both branches side by side) and far above it (log1p(exp(x)) would
  // overflow to inf in float32 past 88): dt is x itself.
  for (float mean : {22.0f, 120.0f}) {
    const ScanCase c{5, 37, 16, true, true, mean};
    SCOPED_TRACE(name_of(c));
    const ScanData s(c, 7);
    const Plain<double> tr = plain_scan<double>(s);
    const Plain<float> nv = plain_scan<float>(s);
    expect_scan_ok(s, run_scan(s, kernels::Backend::Reference), tr, nv);
    testing::for_each_target([&] { expect_scan_ok(s, run_scan(s, kernels::Backend::Fused), tr, nv); });
  }
}

// Token pieces of a T-token call: ones, twos, and the rest.
std::vector<int64_t> pieces_of(int64_t T) {
  std::vector<int64_t> pieces;
  const int64_t sizes[] = {1, 1, 2, 1, 3, 5};
  int64_t left = T;
  for (int64_t n : sizes) {
    if (left == 0) break;
    pieces.push_back(std::min(n, left));
    left -= pieces.back();
  }
  if (left > 0) pieces.push_back(left);
  return pieces;
}

TEST(SelectiveScan, ChunkedCallsEqualOneCall) {
  for (const ScanCase& c : {ScanCase{33, 37, 16, true, true}, ScanCase{33, 5120, 16, true, true},
                            ScanCase{17, 7, 5, false, true}, ScanCase{9, 37, 1, true, false}}) {
    SCOPED_TRACE(name_of(c));
    const ScanData s(c, 21);
    const auto check = [&](kernels::Backend backend) {
      const ScanOut one = run_scan(s, backend);
      ScanOut parts = fresh_out(s);
      int64_t t0 = 0;
      for (int64_t n : pieces_of(c.T)) {
        kernels::selective_scan(params_of(s, parts, t0, n), backend);
        t0 += n;
      }
      EXPECT_TRUE(same_bits(one.y, parts.y));
      EXPECT_TRUE(same_bits(one.y_pre, parts.y_pre) || !c.pre);
      EXPECT_TRUE(same_bits(one.h, parts.h));
    };
    check(kernels::Backend::Reference);
    testing::for_each_target([&] { check(kernels::Backend::Fused); });
  }
}

TEST(SelectiveScan, ThreadCountsGiveTheSameBits) {
  const ScanData s({16, 5120, 16, true, true}, 31);
  const int saved = kernels::num_threads();
  testing::for_each_target([&] {
    kernels::set_num_threads(1);
    const ScanOut one = run_scan(s, kernels::Backend::Fused);
    kernels::set_num_threads(3);
    const ScanOut three = run_scan(s, kernels::Backend::Fused);
    EXPECT_TRUE(same_bits(one.y, three.y));
    EXPECT_TRUE(same_bits(one.y_pre, three.y_pre));
    EXPECT_TRUE(same_bits(one.h, three.h));
  });
  kernels::set_num_threads(saved);
}

TEST(SelectiveScan, NoTokensIsANoOp) {
  const ScanData s({1, 7, 5, true, true}, 3);
  ScanOut o = fresh_out(s);
  kernels::ScanParams p = params_of(s, o, 0, 0);
  p.u = p.delta = p.Bm = p.Cm = nullptr;
  kernels::selective_scan(p);
  kernels::selective_scan(p, kernels::Backend::Reference);
  EXPECT_TRUE(same_bits(o.h, s.h0));
}

// ---------------------------------------------------------------------------------------------
// Causal conv1d + SiLU

struct ConvCase {
  int64_t T = 1, E = 1, K = 4;
};

std::string name_of(const ConvCase& c) {
  return "T" + std::to_string(c.T) + " E" + std::to_string(c.E) + " K" + std::to_string(c.K);
}

// x is the first half of in_proj's (x | z) rows (stride 2E), out rows padded.
struct ConvData {
  ConvCase c;
  int64_t xs, os;
  std::vector<float> x, w, bias, state0;
  ConvData(const ConvCase& cc, uint32_t seed) : c(cc) {
    std::mt19937 rng(seed);
    xs = 2 * c.E, os = c.E + 1;
    x = normal(c.T * xs, rng);
    w = normal(c.K * c.E, rng, 0.0f, 0.5f);
    bias = normal(c.E, rng, 0.0f, 0.5f);
    state0 = normal((c.K - 1) * c.E, rng);
  }
  // Input s of the sequence: state row K-1+s for s < 0.
  float xin(int64_t s, int64_t e) const {
    return s >= 0 ? x[s * xs + e] : state0[(c.K - 1 + s) * c.E + e];
  }
};

struct ConvOut {
  std::vector<float> out, state;
};

ConvOut fresh_out(const ConvData& s) {
  return {std::vector<float>(static_cast<size_t>(s.c.T * s.os), NAN), s.state0};
}

kernels::ConvParams params_of(const ConvData& s, ConvOut& o, int64_t t0, int64_t T) {
  kernels::ConvParams p;
  p.T = T, p.E = s.c.E, p.K = s.c.K;
  p.x = s.x.data() + t0 * s.xs, p.x_stride = s.xs;
  p.w = s.w.data(), p.bias = s.bias.data();
  p.state = s.c.K > 1 ? o.state.data() : nullptr;
  p.out = o.out.data() + t0 * s.os, p.out_stride = s.os;
  return p;
}

ConvOut run_conv(const ConvData& s, kernels::Backend backend) {
  ConvOut o = fresh_out(s);
  kernels::causal_conv1d_silu(params_of(s, o, 0, s.c.T), backend);
  return o;
}

template <typename R>
std::vector<R> plain_conv(const ConvData& s) {
  const int64_t T = s.c.T, E = s.c.E, K = s.c.K;
  std::vector<R> out(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      R acc = s.bias[e];
      for (int64_t k = 0; k < K; ++k) {
        acc += static_cast<R>(s.w[k * E + e]) * static_cast<R>(s.xin(t - (K - 1) + k, e));
      }
      out[t * E + e] = acc / (R(1) + std::exp(-acc));
    }
  }
  return out;
}

// The state after the call: the last K-1 inputs, oldest first (exact copies).
std::vector<float> expected_state(const ConvData& s) {
  const int64_t T = s.c.T, E = s.c.E, S = s.c.K - 1;
  std::vector<float> st(static_cast<size_t>(S * E));
  for (int64_t r = 0; r < S; ++r) {
    for (int64_t e = 0; e < E; ++e) st[r * E + e] = s.xin(T - S + r, e);
  }
  return st;
}

TEST(CausalConv1dSilu, MatchesFloat64OnEveryTargetAndReference) {
  uint32_t seed = 500;
  for (int64_t E : {1, 7, 37, 5120}) {
    for (int64_t K = 1; K <= 4; ++K) {
      for (int64_t T : {1, 2, 3, 33}) {
        const ConvCase c{T, E, K};
        SCOPED_TRACE(name_of(c));
        const ConvData s(c, seed++);
        const std::vector<double> tr = plain_conv<double>(s);
        const std::vector<float> nv = plain_conv<float>(s);
        const std::vector<float> st = expected_state(s);
        const auto check = [&](kernels::Backend backend) {
          const ConvOut o = run_conv(s, backend);
          EXPECT_TRUE(within_rule("out", dense(o.out, T, E, s.os), tr, nv));
          EXPECT_TRUE(same_bits(o.state, st)) << "state";
          for (int64_t t = 0; t < T; ++t) {
            ASSERT_TRUE(std::isnan(o.out[t * s.os + E])) << "out padding";
          }
        };
        check(kernels::Backend::Reference);
        testing::for_each_target([&] { check(kernels::Backend::Fused); });
        if (HasFailure()) return;
      }
    }
  }
}

TEST(CausalConv1dSilu, ChunkedCallsEqualOneCall) {
  // Pieces of 1 and 2 tokens are shorter than K - 1 = 3: the state mixes old rows and new ones.
  for (const ConvCase& c : {ConvCase{33, 37, 4}, ConvCase{33, 5120, 4}, ConvCase{12, 7, 3},
                            ConvCase{9, 7, 1}}) {
    SCOPED_TRACE(name_of(c));
    const ConvData s(c, 41);
    const auto check = [&](kernels::Backend backend) {
      const ConvOut one = run_conv(s, backend);
      ConvOut parts = fresh_out(s);
      int64_t t0 = 0;
      for (int64_t n : pieces_of(c.T)) {
        kernels::causal_conv1d_silu(params_of(s, parts, t0, n), backend);
        t0 += n;
      }
      EXPECT_TRUE(same_bits(one.out, parts.out));
      EXPECT_TRUE(same_bits(one.state, parts.state));
    };
    check(kernels::Backend::Reference);
    testing::for_each_target([&] { check(kernels::Backend::Fused); });
  }
}

TEST(CausalConv1dSilu, ThreadCountsGiveTheSameBits) {
  const ConvData s({64, 5120, 4}, 51);
  const int saved = kernels::num_threads();
  testing::for_each_target([&] {
    kernels::set_num_threads(1);
    const ConvOut one = run_conv(s, kernels::Backend::Fused);
    kernels::set_num_threads(3);
    const ConvOut three = run_conv(s, kernels::Backend::Fused);
    EXPECT_TRUE(same_bits(one.out, three.out));
    EXPECT_TRUE(same_bits(one.state, three.state));
  });
  kernels::set_num_threads(saved);
}

// ---------------------------------------------------------------------------------------------
// Bad params

// f throws InvalidArgument whose message names `field` (and the operator), for both backends.
template <typename P>
void expect_rejected(const P& p, const std::string& field,
                     const std::function<void(const P&, kernels::Backend)>& call) {
  for (kernels::Backend b : {kernels::Backend::Fused, kernels::Backend::Reference}) {
    try {
      call(p, b);
      ADD_FAILURE() << "accepted bad " << field << " (" << kernels::backend_name(b) << ")";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(field), std::string::npos)
          << "message \"" << what << "\" lacks " << field;
    }
  }
}

// bad(field, edit): good with edit applied is refused by both backends, naming field.
template <class P>
auto refusal_check(const P& good,
                   std::type_identity_t<std::function<void(const P&, kernels::Backend)>> call) {
  return [good, call](const std::string& field, const std::function<void(P&)>& edit) {
    P p = good;
    edit(p);
    SCOPED_TRACE(field);
    expect_rejected(p, field, call);
  };
}

TEST(SelectiveScan, BadParamsThrowNamingTheField) {
  const ScanData s({3, 7, 5, true, true}, 61);
  ScanOut o = fresh_out(s);
  const kernels::ScanParams good = params_of(s, o, 0, 3);
  kernels::selective_scan(good);  // the baseline is accepted
  const auto bad = refusal_check(good, [](const kernels::ScanParams& p, kernels::Backend b) {
    kernels::selective_scan(p, b);
  });
  bad("T", [](kernels::ScanParams& p) { p.T = -1; });
  bad("E", [](kernels::ScanParams& p) { p.E = 0; });
  bad("N", [](kernels::ScanParams& p) { p.N = 0; });
  bad("N", [](kernels::ScanParams& p) { p.N = 257; });
  bad("u", [](kernels::ScanParams& p) { p.u = nullptr; });
  bad("delta", [](kernels::ScanParams& p) { p.delta = nullptr; });
  bad("delta_bias", [](kernels::ScanParams& p) { p.delta_bias = nullptr; });
  bad("A", [](kernels::ScanParams& p) { p.A = nullptr; });
  bad("Bm", [](kernels::ScanParams& p) { p.Bm = nullptr; });
  bad("Cm", [](kernels::ScanParams& p) { p.Cm = nullptr; });
  bad("D", [](kernels::ScanParams& p) { p.D = nullptr; });
  bad("h", [](kernels::ScanParams& p) { p.h = nullptr; });
  bad("y", [](kernels::ScanParams& p) { p.y = nullptr; });
  bad("u_stride", [](kernels::ScanParams& p) { p.u_stride = p.E - 1; });
  bad("delta_stride", [](kernels::ScanParams& p) { p.delta_stride = 0; });
  bad("b_stride", [](kernels::ScanParams& p) { p.b_stride = p.N - 1; });
  bad("c_stride", [](kernels::ScanParams& p) { p.c_stride = -4; });
  bad("z_stride", [](kernels::ScanParams& p) { p.z_stride = 1; });
  bad("y_stride", [](kernels::ScanParams& p) { p.y_stride = p.E - 1; });
  bad("y_pre_stride", [](kernels::ScanParams& p) { p.y_pre_stride = 3; });
  // outputs that alias inputs or each other
  bad("y", [&](kernels::ScanParams& p) { p.y = const_cast<float*>(p.u), p.y_stride = p.u_stride; });
  bad("y_pre", [&](kernels::ScanParams& p) { p.y_pre = p.y, p.y_pre_stride = p.y_stride; });
  bad("h", [&](kernels::ScanParams& p) { p.h = const_cast<float*>(p.A) + 1; });
  // y in the columns of z's rows overlaps it; beside them, in the same rows, it does not
  std::vector<float> zy(static_cast<size_t>(3 * 2 * 7));
  bad("y", [&](kernels::ScanParams& p) {
    p.z = zy.data(), p.z_stride = 14, p.y = zy.data() + 3, p.y_stride = 14;
  });
  kernels::ScanParams side = good;
  side.z = zy.data(), side.z_stride = 14, side.y = zy.data() + 7, side.y_stride = 14;
  EXPECT_NO_THROW(kernels::selective_scan(side));
}

TEST(CausalConv1dSilu, BadParamsThrowNamingTheField) {
  const ConvData s({3, 7, 4}, 71);
  ConvOut o = fresh_out(s);
  const kernels::ConvParams good = params_of(s, o, 0, 3);
  const auto bad = refusal_check(good, [](const kernels::ConvParams& p, kernels::Backend b) {
    kernels::causal_conv1d_silu(p, b);
  });
  bad("T", [](kernels::ConvParams& p) { p.T = -2; });
  bad("E", [](kernels::ConvParams& p) { p.E = 0; });
  bad("K", [](kernels::ConvParams& p) { p.K = 0; });
  bad("K", [](kernels::ConvParams& p) { p.K = 17; });
  bad("x", [](kernels::ConvParams& p) { p.x = nullptr; });
  bad("w", [](kernels::ConvParams& p) { p.w = nullptr; });
  bad("bias", [](kernels::ConvParams& p) { p.bias = nullptr; });
  bad("state", [](kernels::ConvParams& p) { p.state = nullptr; });
  bad("out", [](kernels::ConvParams& p) { p.out = nullptr; });
  bad("x_stride", [](kernels::ConvParams& p) { p.x_stride = p.E - 1; });
  bad("out_stride", [](kernels::ConvParams& p) { p.out_stride = 0; });
  bad("out", [](kernels::ConvParams& p) { p.out = const_cast<float*>(p.x), p.out_stride = p.x_stride; });
  bad("state", [](kernels::ConvParams& p) { p.state = p.out + 1; });
  // out in z's half of the (x | z) rows is apart from x
  std::vector<float> xz(static_cast<size_t>(3 * 14));
  kernels::ConvParams side = good;
  side.x = xz.data(), side.x_stride = 14, side.out = xz.data() + 7, side.out_stride = 14;
  EXPECT_NO_THROW(kernels::causal_conv1d_silu(side));
}

}  // namespace
}  // namespace diffattn
