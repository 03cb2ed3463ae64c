// Google Benchmark suite of the fused kernels (not run by `make test`): forward, backward and
// decode of the differential operator beside standard attention of equal parameters, with
// FLOP and byte counters. `diffattn bench` prints the same comparisons with this machine's
// sgemm rate and memory bandwidth measured in the same run.
//   build/bench/bench_kernels --benchmark_filter=fwd --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include "bench/cases/bench_cases.h"
#include "diffattn/kernels/attention.h"

namespace diffattn::bench {
namespace {

ShapeSpec shape(int64_t T, int64_t Tq, bool standard) {
  ShapeSpec s;
  s.maps = 2;
  s.H = 4, s.G = 4, s.D = 64, s.Dv = 128;
  s.Tq = Tq, s.Tk = T;
  s.causal = true;
  return standard ? standard_equivalent(s) : s;
}

void report(benchmark::State& state, double flops, double bytes) {
  const double n = static_cast<double>(state.iterations());
  if (flops > 0) state.counters["GFLOP/s"] = benchmark::Counter(flops * n * 1e-9, benchmark::Counter::kIsRate);
  if (bytes > 0) state.counters["GB/s"] = benchmark::Counter(bytes * n * 1e-9, benchmark::Counter::kIsRate);
}

void BM_fwd(benchmark::State& state) {
  Tensors t(shape(state.range(0), state.range(0), state.range(1) != 0));
  for (auto _ : state) attention_fwd(t.p);
  report(state, t.fwd_flops(), 0);
}

void BM_bwd(benchmark::State& state) {
  Tensors t(shape(state.range(0), state.range(0), state.range(1) != 0));
  attention_fwd(t.p);
  const AttnBwdParams b = t.bwd();
  for (auto _ : state) attention_bwd(b);
  report(state, 2.5 * t.fwd_flops(), 0);
}

void BM_decode(benchmark::State& state) {
  Tensors t(shape(state.range(0), 1, state.range(1) != 0));
  for (auto _ : state) attention_fwd(t.p);
  report(state, 0, t.kv_bytes());
}

void BM_upstream_fwd(benchmark::State& state) {
  Tensors t(shape(state.range(0), state.range(0), false));
  UpstreamRecipe up(t);
  for (auto _ : state) up.forward();
  report(state, t.fwd_flops(), 0);
}

// Args: {T, standard (0: differential V1, 1: standard attention with 2H heads)}
BENCHMARK(BM_fwd)->ArgsProduct({{1024, 4096}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_bwd)->ArgsProduct({{1024, 4096}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_decode)->ArgsProduct({{8192, 32768}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_upstream_fwd)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace diffattn::bench

BENCHMARK_MAIN();
