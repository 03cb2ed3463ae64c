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

// The V1 case of `diffattn bench` (B=1, 4 pairs of D=64, Dv=128, 4 groups, causal) with Tq
// queries against T keys, or its standard peer of equal parameters (2H heads of size D).
AttnCase shape(int64_t T, int64_t Tq, bool standard) {
  AttnCase c{"bench", 2, 1, Tq, T, 4, 4, 64, 128};
  c.causal = true;
  return standard ? standard_equivalent(c) : c;
}

void report(benchmark::State& state, double flops, double bytes) {
  const double n = static_cast<double>(state.iterations());
  if (flops > 0) state.counters["GFLOP/s"] = benchmark::Counter(flops * n * 1e-9, benchmark::Counter::kIsRate);
  if (bytes > 0) state.counters["GB/s"] = benchmark::Counter(bytes * n * 1e-9, benchmark::Counter::kIsRate);
}

void BM_fwd(benchmark::State& state) {
  Tensors t(shape(state.range(0), state.range(0), state.range(1) != 0));
  for (auto _ : state) attention_fwd(t.p);
  report(state, t.c.fwd_flops(), 0);
}

void BM_bwd(benchmark::State& state) {
  Tensors t(shape(state.range(0), state.range(0), state.range(1) != 0));
  attention_fwd(t.p);
  const AttnBwdParams b = t.bwd();
  for (auto _ : state) attention_bwd(b);
  report(state, t.c.bwd_flops(), 0);
}

void BM_decode(benchmark::State& state) {
  Tensors t(shape(state.range(0), 1, state.range(1) != 0));
  for (auto _ : state) attention_fwd(t.p);
  report(state, 0, t.c.kv_bytes());
}

void BM_upstream_fwd(benchmark::State& state) {
  Tensors t(shape(state.range(0), state.range(0), false));
  UpstreamRecipe up(t);
  for (auto _ : state) up.forward();
  report(state, t.c.fwd_flops(), 0);
}

// Args: {T, standard (0: differential V1, 1: standard attention with 2H heads)}
BENCHMARK(BM_fwd)->ArgsProduct({{1024, 4096}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_bwd)->ArgsProduct({{1024, 4096}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_decode)->ArgsProduct({{8192, 32768}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_upstream_fwd)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace diffattn::bench

BENCHMARK_MAIN();
