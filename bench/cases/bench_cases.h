// What `diffattn bench` and the Google Benchmark suite (bench/) time: owned random tensors for
// one operator shape, the upstream two-call recipe, and this machine's limits measured in the
// same process (OpenBLAS sgemm rate, memory read bandwidth).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diffattn/kernels/attention.h"

namespace diffattn::bench {

struct ShapeSpec {
  int maps = 2;
  int64_t B = 1, Tq = 1, Tk = 1, H = 1, G = 1, D = 64, Dv = 128;
  bool shared_keys = false, lam_per_token = false, causal = false;
  std::string str() const;  // "B=1 H=4 G=4 Tq=4096 Tk=4096 D=64 Dv=128"
};

// Contiguous random inputs, allocated outputs, saved statistics and gradients for one shape.
struct Tensors {
  ShapeSpec s;
  AttnParams p;  // points into the vectors below
  std::vector<float> q, k, v, lam, out, lse, o2, dout, dq, dk, dv, dlam;

  // with_grads: allocate dout and the gradients too (a forward-only run leaves them out).
  explicit Tensors(const ShapeSpec& spec, uint32_t seed = 1, bool with_grads = true);
  Tensors(const Tensors&) = delete;
  Tensors& operator=(const Tensors&) = delete;
  AttnBwdParams bwd();  // writes the gradient buffers
  double fwd_flops() const { return attention_fwd_flops(p); }
  // Bytes of K and V one forward reads (each cache row once): the decode traffic.
  double kv_bytes() const;
};

// The standard attention of equal parameters: 2H heads of size D (values of size D), keys
// and values with 2G heads.
ShapeSpec standard_equivalent(const ShapeSpec& diff);
// DIFF V2 of the same model size as that standard peer: its 2H heads become 2H output heads of
// 4H query heads (two maps each), keys and values keep the standard's 2G heads of size D and
// are shared by both maps, lambda per token. Twice the standard's FLOPs, the same cache bytes.
ShapeSpec v2_equivalent(const ShapeSpec& diff);

// The upstream recipe (the Differential Transformer's reference code): split q and k into the
// two maps' heads, two standard attention calls (our fused kernel), then out = o1 - lam o2.
class UpstreamRecipe {
 public:
  explicit UpstreamRecipe(Tensors& t);  // writes t.out
  void forward();
  // Backward of the recipe: two standard backward calls, dlam = -dout . o2.
  void backward();

 private:
  Tensors& t_;
  std::vector<float> q1, q2, k1, k2, o1, o2, lse1, lse2, dout2, dq1, dq2, dk1, dk2, dv1, dv2;
  AttnParams p1, p2;
  void split();
};

// OpenBLAS sgemm, C (n x n) = A B, on `threads` threads: GFLOP/s of one call.
double sgemm_gflops(int64_t n, int threads);
// Read bandwidth of a buffer far larger than the caches (sum of all its floats), GB/s.
class ReadBandwidth {
 public:
  explicit ReadBandwidth(int64_t bytes);
  double measure(int threads);

 private:
  std::vector<float> buf_;
};

// Seconds of one call of f.
template <class F>
double seconds_of(F&& f);

}  // namespace diffattn::bench

#include <chrono>

namespace diffattn::bench {
template <class F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace diffattn::bench
