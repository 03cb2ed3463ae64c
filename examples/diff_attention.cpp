// Differential attention from C++: one causal DIFF V1 call, its saved statistics, and the
// backward that reuses them. Build: link the CMake target diffattn_kernels.
#include <cstdio>
#include <random>
#include <vector>

#include "diffattn/kernels/attention.h"

int main() {
  using namespace diffattn::kernels;
  const int64_t B = 2, T = 128, H = 4, G = 2, D = 32;  // 4 pairs over 2 key/value groups
  std::mt19937 rng(0);
  std::normal_distribution<float> n01;
  auto randn = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = n01(rng);
    return x;
  };
  std::vector<float> q = randn(B * T * 2 * H * D), k = randn(B * T * 2 * G * D),
                     v = randn(B * T * G * 2 * D), lam(H, 0.8f);
  AttnOptions opts;
  opts.causal = true;
  AttnParams p = diff_attn_params({q.data(), {B, T, 2 * H, D}}, {k.data(), {B, T, 2 * G, D}},
                                  {v.data(), {B, T, G, 2 * D}}, {lam.data(), {H}}, opts);
  std::vector<float> out(B * T * H * 2 * D), lse(B * 2 * H * T), o2(out.size());
  p.out = out.data();  // (B, T, H, 2D)
  p.lse = lse.data();  // (B, 2H, T): saved for the backward
  p.o2 = o2.data();    // (B, T, H, 2D): map 2's output
  attention_fwd(p);

  AttnBwdParams bp(p);
  std::vector<float> dout = randn(B * T * H * 2 * D), dq(q.size()), dk(k.size()), dv(v.size()),
                     dlam(H);
  bp.dout = dout.data();
  bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data(), bp.dlam = dlam.data();
  attention_bwd(bp);  // no forward again: it reads out, lse and o2
  std::printf("out[0] = %.6f  dlam[0] = %.6f  calls: %llu forward, %llu backward\n", out[0],
              dlam[0], static_cast<unsigned long long>(kernel_calls().forward),
              static_cast<unsigned long long>(kernel_calls().backward));
  return kernel_calls().forward == 1 && kernel_calls().backward == 1 ? 0 : 1;
}
