// Google Benchmark of Mamba-1's kernels (kernels/ssm.h) at the published shape (E = 5120,
// N = 16, K = 4; not run by `make test`): the selective scan and the causal conv1d for a decode
// token (T = 1) and a prefill chunk (T = 512), beside a read-read-write stream of the same bytes
// as the scan's state update (h = f(A, h)), the memory bandwidth the decode step is bound by.
// `copies` rotates that many (h, A, conv state) sets, 64 (42 MB) being more than the last-level
// cache: decode's states come from DRAM (the model's weights stream through the cache between
// one layer's call and the next token's).
//   build/bench/bench_ssm --benchmark_filter=scan --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "diffattn/kernels/runtime.h"
#include "diffattn/kernels/ssm.h"

namespace diffattn {
namespace {

constexpr int64_t kE = 5120, kN = 16, kK = 4;

std::vector<float> normal(int64_t n, uint32_t seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

void per_token(benchmark::State& state, int64_t T, double bytes) {
  const double n = static_cast<double>(state.iterations());
  state.counters["ns/token"] = benchmark::Counter(
      static_cast<double>(T) * n * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["GB/s"] = benchmark::Counter(bytes * n * 1e-9, benchmark::Counter::kIsRate);
}

// Args: {T, copies, threads (0: the library's default)}
void BM_scan(benchmark::State& state) {
  const int64_t T = state.range(0), copies = state.range(1);
  const int saved = kernels::num_threads();
  if (state.range(2) > 0) kernels::set_num_threads(static_cast<int>(state.range(2)));
  const std::vector<float> u = normal(T * kE, 1), delta = normal(T * kE, 2),
                           bias = normal(kE, 3, -4.0f), bc = normal(T * 2 * kN, 4),
                           D = normal(kE, 5), z = normal(T * kE, 6);
  std::vector<std::vector<float>> A(static_cast<size_t>(copies)), h(A.size());
  for (size_t i = 0; i < A.size(); ++i) {
    A[i] = normal(kE * kN, 7 + static_cast<uint32_t>(i), -1.0f, 0.5f);
    for (float& a : A[i]) a = -std::exp(a + 1.0f);
    h[i] = normal(kE * kN, 100 + static_cast<uint32_t>(i));
  }
  std::vector<float> y(static_cast<size_t>(T * kE));
  kernels::ScanParams p;
  p.T = T, p.E = kE, p.N = kN;
  p.u = u.data(), p.u_stride = kE;
  p.delta = delta.data(), p.delta_stride = kE;
  p.delta_bias = bias.data(), p.D = D.data();
  p.Bm = bc.data(), p.b_stride = 2 * kN;
  p.Cm = bc.data() + kN, p.c_stride = 2 * kN;
  p.z = z.data(), p.z_stride = kE;
  p.y = y.data(), p.y_stride = kE;
  size_t i = 0;
  for (auto _ : state) {
    p.A = A[i].data(), p.h = h[i].data();
    kernels::selective_scan(p);
    benchmark::ClobberMemory();
    i = i + 1 == A.size() ? 0 : i + 1;
  }
  kernels::set_num_threads(saved);
  // h read and written, A read; u, delta, z read and y written per token; bias and D once
  const double bytes = 4.0 * (3.0 * kE * kN + 4.0 * T * kE + 2.0 * T * kN + 2.0 * kE);
  per_token(state, T, bytes);
}

// Args: {T, copies, threads}
void BM_conv(benchmark::State& state) {
  const int64_t T = state.range(0), copies = state.range(1);
  const int saved = kernels::num_threads();
  if (state.range(2) > 0) kernels::set_num_threads(static_cast<int>(state.range(2)));
  const std::vector<float> x = normal(T * 2 * kE, 1), w = normal(kK * kE, 2), b = normal(kE, 3);
  std::vector<std::vector<float>> st(static_cast<size_t>(copies), normal((kK - 1) * kE, 4));
  std::vector<float> out(static_cast<size_t>(T * kE));
  kernels::ConvParams p;
  p.T = T, p.E = kE, p.K = kK;
  p.x = x.data(), p.x_stride = 2 * kE;  // the x half of in_proj's (x | z) rows
  p.w = w.data(), p.bias = b.data();
  p.out = out.data(), p.out_stride = kE;
  size_t i = 0;
  for (auto _ : state) {
    p.state = st[i].data();
    kernels::causal_conv1d_silu(p);
    benchmark::ClobberMemory();
    i = i + 1 == st.size() ? 0 : i + 1;
  }
  kernels::set_num_threads(saved);
  const double bytes = 4.0 * (2.0 * (kK - 1) * kE + (kK + 1) * kE + 2.0 * T * kE);
  per_token(state, T, bytes);
}

// h[i] = a[i] * h[i] + 1 over E * N floats of `copies` rotating sets, on every thread: the
// memory traffic of one decode scan's state update without its arithmetic (12 bytes per float).
void BM_stream(benchmark::State& state) {
  const int64_t copies = state.range(0), n = kE * kN;
  std::vector<std::vector<float>> a(static_cast<size_t>(copies), normal(n, 1)),
      h(static_cast<size_t>(copies), normal(n, 2));
  const int threads = kernels::num_threads();
  size_t i = 0;
  for (auto _ : state) {
    const float* ap = a[i].data();
    float* hh = h[i].data();
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (int64_t j = 0; j < n; ++j) hh[j] = ap[j] * hh[j] + 1.0f;
    benchmark::ClobberMemory();
    i = i + 1 == a.size() ? 0 : i + 1;
  }
  state.counters["GB/s"] = benchmark::Counter(
      12.0 * static_cast<double>(n) * static_cast<double>(state.iterations()) * 1e-9,
      benchmark::Counter::kIsRate);
}

// Args: {T, copies, threads (0: the library's default)}
BENCHMARK(BM_scan)->ArgsProduct({{1}, {1, 64}, {1, 0}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_scan)->ArgsProduct({{512}, {1}, {1, 0}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_conv)->ArgsProduct({{1}, {1, 64}, {1, 0}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_conv)->ArgsProduct({{512}, {1}, {1, 0}})->Unit(benchmark::kMicrosecond)->UseRealTime();
// Args: {copies}
BENCHMARK(BM_stream)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace diffattn

BENCHMARK_MAIN();
