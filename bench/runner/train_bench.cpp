// `diffattn train --bench` (train_bench.h).
#include "bench/runner/train_bench.h"

#include <chrono>
#include <cstdint>
#include <iostream>
#include <vector>

#include "diffattn/kernels/runtime.h"

namespace diffattn::bench {

int run_train_bench(const model::ModelConfig& cfg, const train::TrainOptions& o, int64_t steps) {
  // Random tokens: throughput does not depend on the text.
  std::vector<int32_t> toks(static_cast<size_t>(1 << 20));
  uint64_t s = o.seed;
  for (int32_t& t : toks) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(cfg.vocab_size));
  }
  data::TokenWindows ds(std::move(toks), o.seed, "random");
  train::Trainer tr("", cfg, o);
  tr.write_log = false;
  tr.step(ds);  // warm-up: allocations, page faults, BLAS threads
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) tr.step(ds);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tokens = static_cast<double>(steps * o.accum * o.batch * o.seq_len);
  std::cout << "bench train: " << nn::attn_kind_name(cfg.attention) << " params "
            << tr.model().num_params() << " batch " << o.batch << " seq_len " << o.seq_len
            << " threads " << kernels::num_threads() << " backend "
            << kernels::backend_name(kernels::resolve_backend(kernels::Backend::Auto)) << ": " << steps << " steps in "
            << dt << " s, " << tokens / dt << " tokens/s\n";
  return 0;
}

}  // namespace diffattn::bench
