// Google Benchmark suite of the fused kernels (not run by `make test`): forward, backward and
// decode of the differential operator beside standard attention of equal parameters, with
// FLOP and byte counters. `diffattn bench` prints the same comparisons with this machine's
// sgemm rate and memory bandwidth measured in the same run.
//   build/bench/bench_kernels --benchmark_filter=fwd --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "bench/cases/bench_cases.h"
#include "diffattn/base/dtype.h"
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
  for (auto _ : state) kernels::attention_fwd(t.p);
  report(state, t.c.fwd_flops(), 0);
}

void BM_bwd(benchmark::State& state) {
  Tensors t(shape(state.range(0), state.range(0), state.range(1) != 0));
  kernels::attention_fwd(t.p);
  const kernels::AttnBwdParams b = t.bwd();
  for (auto _ : state) kernels::attention_bwd(b);
  report(state, t.c.bwd_flops(), 0);
}

void BM_decode(benchmark::State& state) {
  Tensors t(shape(state.range(0), 1, state.range(1) != 0));
  for (auto _ : state) kernels::attention_fwd(t.p);
  report(state, 0, t.c.kv_bytes());
}

void BM_upstream_fwd(benchmark::State& state) {
  Tensors t(shape(state.range(0), state.range(0), false));
  UpstreamRecipe up(t);
  for (auto _ : state) up.forward();
  report(state, t.c.fwd_flops(), 0);
}

// A prompt chunk of Tq rows at the end of T positions kept in a pool of 16-position blocks in
// shuffled order (a serving engine's KV memory), V1, K/V float32 or bfloat16. path 0: in place
// (attention_paged, one sequence of Tq rows: the tiled forward packs each tile from the
// blocks); path 1: the way before it, every position's rows gathered into a contiguous copy
// (widened to float32 for a 16-bit pool) and the tiled forward run on the copy.
void BM_chunk(benchmark::State& state) {
  const int64_t T = state.range(0), Tq = state.range(1), bs = 16;
  AttnCase c = shape(T, Tq, false);
  c.kv_dtype = state.range(2) != 0 ? DType::BF16 : DType::F32;
  Tensors t(c, 1, false);
  const kernels::AttnParams& p = t.p;
  const bool f32 = c.kv_dtype == DType::F32;
  const size_t es = dtype_size(c.kv_dtype);
  const int64_t krow = p.key_heads() * p.D, vrow = p.G * p.Dv, nb = (T + bs - 1) / bs;
  std::vector<int32_t> table(static_cast<size_t>(nb));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  auto bytes = [](const void* x) { return static_cast<const char*>(x); };
  const char* ksrc = bytes(p.k);
  const char* vsrc = bytes(p.v);
  // n rows of `row` elements from row `from` of src to row `to` of dst
  auto rows = [es](char* dst, int64_t to, const char* src, int64_t from, int64_t n, int64_t row) {
    std::memcpy(dst + static_cast<size_t>(to * row) * es, src + static_cast<size_t>(from * row) * es,
                static_cast<size_t>(n * row) * es);
  };
  std::vector<char> kpool(static_cast<size_t>(nb * bs * krow) * es);
  std::vector<char> vpool(static_cast<size_t>(nb * bs * vrow) * es);
  for (int64_t j = 0; j < T; ++j) {  // the case's rows (contiguous strides) into their blocks
    const int64_t at = table[static_cast<size_t>(j / bs)] * bs + j % bs;
    rows(kpool.data(), at, ksrc, j, 1, krow);
    rows(vpool.data(), at, vsrc, j, 1, vrow);
  }
  if (state.range(3) == 0) {
    kernels::PagedAttnParams pp;
    pp.B = 1, pp.H = p.H, pp.G = p.G, pp.D = p.D, pp.Dv = p.Dv, pp.maps = p.maps;
    pp.scale = 1.0f / std::sqrt(static_cast<float>(p.D));
    pp.n_blocks = nb, pp.block_size = bs, pp.table_stride = nb;
    const int64_t starts[2] = {0, Tq}, len = T;
    pp.q_starts = starts, pp.seq_lens = &len, pp.block_tables = table.data();
    pp.q = p.q, pp.lam = p.lam, pp.out = p.out, pp.kv_dtype = c.kv_dtype;
    pp.k_pool = kpool.data();
    pp.v_pool = vpool.data();
    pp.set_contiguous_strides();
    for (auto _ : state) kernels::attention_paged(pp);
  } else {
    std::vector<char> kc(kpool.size()), vc(vpool.size());
    std::vector<float> kf(f32 ? 0 : static_cast<size_t>(T * krow));
    std::vector<float> vf(f32 ? 0 : static_cast<size_t>(T * vrow));
    kernels::AttnParams g = p;
    g.kv_dtype = DType::F32;
    g.k = f32 ? reinterpret_cast<const float*>(kc.data()) : kf.data();
    g.v = f32 ? reinterpret_cast<const float*>(vc.data()) : vf.data();
    g.k_row_stride = krow, g.k_head_stride = p.D, g.k_batch_stride = T * krow;
    g.v_row_stride = vrow, g.v_head_stride = p.Dv, g.v_batch_stride = T * vrow;
    for (auto _ : state) {
      for (int64_t j0 = 0; j0 < T; j0 += bs) {
        const int64_t n = std::min(bs, T - j0), at = table[static_cast<size_t>(j0 / bs)] * bs;
        rows(kc.data(), j0, kpool.data(), at, n, krow);
        rows(vc.data(), j0, vpool.data(), at, n, vrow);
      }
      if (!f32) {
        convert_to_f32(kf.data(), kc.data(), c.kv_dtype, T * krow);
        convert_to_f32(vf.data(), vc.data(), c.kv_dtype, T * vrow);
      }
      kernels::attention_fwd(g);
    }
  }
  report(state, c.fwd_flops(), 0);
}

// Args: {T, standard (0: differential V1, 1: standard attention with 2H heads)}
BENCHMARK(BM_fwd)->ArgsProduct({{1024, 4096}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_bwd)->ArgsProduct({{1024, 4096}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_decode)->ArgsProduct({{8192, 32768}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
// Args: {T, Tq, K/V bfloat16, path (0: in place, 1: gathered as before)}
BENCHMARK(BM_chunk)
    ->ArgsProduct({{4096}, {512, 64}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_upstream_fwd)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace diffattn::bench

BENCHMARK_MAIN();
