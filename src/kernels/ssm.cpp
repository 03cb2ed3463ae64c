// Mamba-1's selective scan and causal conv1d (kernels/ssm.h): the params checks, the reference
// oracles and the dispatch API -> check -> backend (reference, or the Highway kernels of
// ssm_simd.cpp).
#include "diffattn/kernels/ssm.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "diffattn/base/error.h"

namespace diffattn::kernels {

// The SIMD kernels (ssm_simd.cpp), params already checked.
void selective_scan_fused(const ScanParams& p);
void causal_conv1d_silu_fused(const ConvParams& p);

namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + what);
}

// Sizes beyond these are a caller's bug (a negative size cast to unsigned, a stray pointer):
// every offset then stays far below 2^63.
constexpr int64_t kMaxRows = int64_t{1} << 40;   // T
constexpr int64_t kMaxWidth = int64_t{1} << 31;  // E, strides
constexpr int64_t kMaxN = 256, kMaxK = 16;

void need_range(const char* op, const char* name, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    fail(op, std::string(name) + " = " + std::to_string(v) + ", expected " + std::to_string(lo) +
                 ".." + std::to_string(hi));
  }
}

void need_data(const char* op, const char* name, const void* data) {
  if (data == nullptr) fail(op, std::string(name) + " has no data (null pointer)");
}

// A (rows, width) tensor whose row r starts at data + r * stride (elements); rows == 0: none.
struct Rows2 {
  const char* name;
  const float* data;
  int64_t rows, width, stride;
};

void need_stride(const char* op, const Rows2& x, const char* stride_name) {
  if (x.rows > 1 && (x.stride < x.width || x.stride > kMaxWidth)) {
    fail(op, std::string(stride_name) + " = " + std::to_string(x.stride) + ": " + x.name +
                 " has rows of " + std::to_string(x.width) + " floats (" +
                 std::to_string(x.rows) + " rows), expected a stride of at least " +
                 std::to_string(x.width));
  }
}

// Whether two strided row sets share an element. Disjoint address ranges do not; nor do row sets
// with one stride whose column intervals stay apart modulo it (x and z interleaved in one
// in_proj output, each row [x | z]); anything else counts as overlapping.
bool overlaps(const Rows2& a, const Rows2& b) {
  if (a.rows == 0 || b.rows == 0 || a.data == nullptr || b.data == nullptr) return false;
  const auto lo = [](const Rows2& x) { return reinterpret_cast<uintptr_t>(x.data); };
  const auto hi = [&](const Rows2& x) {  // one past the last element
    return lo(x) + sizeof(float) * static_cast<uintptr_t>((x.rows - 1) * x.stride + x.width);
  };
  if (hi(a) <= lo(b) || hi(b) <= lo(a)) return false;
  if (a.rows == 1 && b.rows == 1) return true;
  const int64_t st = a.rows > 1 ? a.stride : b.stride;
  if ((a.rows > 1 && a.stride != st) || (b.rows > 1 && b.stride != st)) return true;
  const intptr_t bytes = static_cast<intptr_t>(lo(b)) - static_cast<intptr_t>(lo(a));
  if (bytes % static_cast<intptr_t>(sizeof(float)) != 0) return true;
  const int64_t off = ((bytes / static_cast<intptr_t>(sizeof(float))) % st + st) % st;
  // b's columns start `off` after a's, modulo the stride: apart iff b fits after a's end and
  // before a's next row
  return !(off >= a.width && off + b.width <= st);
}

void need_apart(const char* op, std::initializer_list<Rows2> outs,
                std::initializer_list<Rows2> ins) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    for (const Rows2& x : ins) {
      if (overlaps(*o, x)) {
        fail(op, std::string(o->name) + " overlaps the input " + x.name +
                     " (outputs never alias inputs)");
      }
    }
    for (auto o2 = o + 1; o2 != outs.end(); ++o2) {
      if (overlaps(*o, *o2)) fail(op, std::string(o->name) + " overlaps the output " + o2->name);
    }
  }
}

// softplus with mamba_ssm's threshold: x for x > 20, log1p(exp(x)) otherwise.
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
double silu(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace

void check_params(const ScanParams& p, const char* op) {
  need_range(op, "T", p.T, 0, kMaxRows);
  need_range(op, "E", p.E, 1, kMaxWidth);
  need_range(op, "N", p.N, 1, kMaxN);
  need_data(op, "A", p.A);
  need_data(op, "h", p.h);
  if (p.T == 0) return;
  need_data(op, "u", p.u);
  need_data(op, "delta", p.delta);
  need_data(op, "delta_bias", p.delta_bias);
  need_data(op, "Bm", p.Bm);
  need_data(op, "Cm", p.Cm);
  need_data(op, "D", p.D);
  need_data(op, "y", p.y);
  const Rows2 u{"u", p.u, p.T, p.E, p.u_stride}, delta{"delta", p.delta, p.T, p.E, p.delta_stride},
      B{"Bm", p.Bm, p.T, p.N, p.b_stride}, C{"Cm", p.Cm, p.T, p.N, p.c_stride},
      z{"z", p.z, p.z ? p.T : 0, p.E, p.z_stride}, y{"y", p.y, p.T, p.E, p.y_stride},
      y_pre{"y_pre", p.y_pre, p.y_pre ? p.T : 0, p.E, p.y_pre_stride};
  need_stride(op, u, "u_stride");
  need_stride(op, delta, "delta_stride");
  need_stride(op, B, "b_stride");
  need_stride(op, C, "c_stride");
  need_stride(op, z, "z_stride");
  need_stride(op, y, "y_stride");
  need_stride(op, y_pre, "y_pre_stride");
  const Rows2 A{"A", p.A, 1, p.E * p.N, 0}, h{"h", p.h, 1, p.E * p.N, 0},
      bias{"delta_bias", p.delta_bias, 1, p.E, 0}, D{"D", p.D, 1, p.E, 0};
  need_apart(op, {y, y_pre, h}, {u, delta, bias, A, B, C, D, z});
}

void check_params(const ConvParams& p, const char* op) {
  need_range(op, "T", p.T, 0, kMaxRows);
  need_range(op, "E", p.E, 1, kMaxWidth);
  need_range(op, "K", p.K, 1, kMaxK);
  if (p.K > 1) need_data(op, "state", p.state);
  if (p.T == 0) return;
  need_data(op, "x", p.x);
  need_data(op, "w", p.w);
  need_data(op, "bias", p.bias);
  need_data(op, "out", p.out);
  const Rows2 x{"x", p.x, p.T, p.E, p.x_stride}, out{"out", p.out, p.T, p.E, p.out_stride};
  need_stride(op, x, "x_stride");
  need_stride(op, out, "out_stride");
  const Rows2 w{"w", p.w, 1, p.K * p.E, 0}, bias{"bias", p.bias, 1, p.E, 0},
      state{"state", p.state, p.K - 1, p.E, p.E};
  need_apart(op, {out, state}, {x, w, bias});
}

void selective_scan_ref(const ScanParams& p) {
  check_params(p, "selective_scan");
  const int64_t E = p.E, N = p.N;
  for (int64_t t = 0; t < p.T; ++t) {
    const float* B = p.Bm + t * p.b_stride;
    const float* C = p.Cm + t * p.c_stride;
    for (int64_t e = 0; e < E; ++e) {
      const double u = p.u[t * p.u_stride + e];
      const double dt =
          softplus(static_cast<double>(p.delta[t * p.delta_stride + e]) + p.delta_bias[e]);
      float* h = p.h + e * N;
      const float* A = p.A + e * N;
      double y = 0;
      for (int64_t n = 0; n < N; ++n) {
        const double hn = std::exp(dt * A[n]) * h[n] + dt * B[n] * u;
        y += hn * C[n];
        h[n] = static_cast<float>(hn);
      }
      y += static_cast<double>(p.D[e]) * u;
      if (p.y_pre) p.y_pre[t * p.y_pre_stride + e] = static_cast<float>(y);
      if (p.z) y *= silu(p.z[t * p.z_stride + e]);
      p.y[t * p.y_stride + e] = static_cast<float>(y);
    }
  }
}

void causal_conv1d_silu_ref(const ConvParams& p) {
  check_params(p, "causal_conv1d_silu");
  const int64_t T = p.T, E = p.E, K = p.K, S = K - 1;
  // xin[s]: a new row for s >= 0, the state's row S + s before it
  const auto xin = [&](int64_t s, int64_t e) -> double {
    return s >= 0 ? p.x[s * p.x_stride + e] : p.state[(S + s) * E + e];
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double acc = p.bias[e];
      for (int64_t k = 0; k < K; ++k) {
        acc += static_cast<double>(p.w[k * E + e]) * xin(t - S + k, e);
      }
      p.out[t * p.out_stride + e] = static_cast<float>(silu(acc));
    }
  }
  // New row r is input T - S + r: an old state row S + (T - S + r) = T + r > r when T < S, so
  // ascending r reads each old row before it is overwritten.
  for (int64_t r = 0; r < S; ++r) {
    for (int64_t e = 0; e < E; ++e) p.state[r * E + e] = static_cast<float>(xin(T - S + r, e));
  }
}

void selective_scan(const ScanParams& p, Backend backend) {
  if (resolve_backend(backend) == Backend::Reference) return selective_scan_ref(p);
  check_params(p, "selective_scan");
  if (p.T > 0) selective_scan_fused(p);
}

void causal_conv1d_silu(const ConvParams& p, Backend backend) {
  if (resolve_backend(backend) == Backend::Reference) return causal_conv1d_silu_ref(p);
  check_params(p, "causal_conv1d_silu");
  if (p.T > 0) causal_conv1d_silu_fused(p);
}

}  // namespace diffattn::kernels
