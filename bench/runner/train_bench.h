// The benchmark behind `diffattn train --bench N`: N training steps (forward, backward and an
// AdamW step through the Trainer) on random tokens, after one warm-up step, timed as tokens/s.
// No files are written. The CLI (src/cli/cmd_train.cpp) parses the flags.
#pragma once

#include <cstdint>

#include "diffattn/model/config.h"
#include "diffattn/train/train.h"

namespace diffattn::bench {

// Prints one line to stdout ("bench train: KIND params ... tokens/s"). Returns 0.
int run_train_bench(const model::ModelConfig& cfg, const train::TrainOptions& o, int64_t steps);

}  // namespace diffattn::bench
