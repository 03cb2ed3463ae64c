// The benchmark behind `diffattn generate --model DIR --bench N`: one greedy generation through
// the generation loop generate and Python run (a prefill of the prompt, then N decode steps),
// timed and set against this machine's limits measured in the same run: the prefill's GFLOP/s
// against the OpenBLAS sgemm rate, decode's tokens/s against the bound read bandwidth / bytes
// read a token (the weights plus the K/V or recurrent state at the mean length), the load time
// and the peak RSS against the weights. The CLI (src/cli/cmd_generate.cpp) parses the flags.
#pragma once

#include <cstdint>

#include "diffattn/base/dtype.h"
#include "diffattn/model/model.h"

namespace diffattn::bench {

// Prints the report to stdout; prompt_len prompt tokens (a fixed pattern of ids), n decode
// steps (fewer when they would pass max_seq_len), K/V stored as kv_dtype. load_s: how long the
// caller took to load m (printed). Returns 0.
int run_generate_bench(const model::Model& m, int64_t prompt_len, int64_t n, double load_s, DType kv_dtype);

}  // namespace diffattn::bench
