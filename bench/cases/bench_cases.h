// What `diffattn bench` and the Google Benchmark suite (bench/) time: the owned tensors of one
// attention case (attn_case.h), the upstream two-call recipe, and this machine's limits
// measured in the same process (OpenBLAS sgemm rate, memory read bandwidth).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/cases/attn_case.h"
#include "diffattn/kernels/attention.h"

namespace diffattn::bench {

// Contiguous seeded inputs of a case (make_inputs), allocated outputs, saved statistics and
// gradients. A case with 16-bit K/V (kv_dtype) holds K and V only in that type (k and v
// empty; kv16, which p reads) and no gradients: forward and decode only.
struct Tensors {
  AttnCase c;
  kernels::AttnParams p;  // points into the vectors below
  std::vector<float> q, lam, out, lse, o2, dout, dq, dk, dv, dlam;
  PageVector<float> k;  // placed as a model's KV cache (base/memory.h)
  PageVector<float, kValuePageOffset> v;
  std::unique_ptr<Kv16> kv16;  // kv_dtype != F32

  // with_grads: allocate dout and the gradients too (a forward-only run leaves them out).
  explicit Tensors(const AttnCase& c, uint32_t seed = 1, bool with_grads = true);
  Tensors(const Tensors&) = delete;
  Tensors& operator=(const Tensors&) = delete;
  kernels::AttnBwdParams bwd();  // writes the gradient buffers
};

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
  kernels::AttnParams p1, p2;
  void split();
};

// OpenBLAS sgemm, C (n x n) = A B, on `threads` threads: GFLOP/s of one call.
double sgemm_gflops(int64_t n, int threads);
// Read bandwidth of a buffer far larger than the caches (sum of all its floats), GB/s.
class ReadBandwidth {
 public:
  explicit ReadBandwidth(int64_t bytes);
  double measure(int threads);
  // Reads the first 2x last-level-cache bytes of the buffer (64 MiB where the size is not
  // known), so that what a timed call reads next comes from memory: a decode step of a
  // many-layer model finds its layer's cache evicted by the other layers'.
  void evict_caches();

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
