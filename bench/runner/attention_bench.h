// The benchmark behind `diffattn bench`: the fused attention kernels timed beside their peers
// (standard attention of equal parameters, the upstream two-call recipe, the reference, DIFF V2
// of the same model size) and this machine's limits (OpenBLAS sgemm rate, memory read
// bandwidth), all measured in one run in interleaved rounds (every variant once per round,
// medians quoted), so a drift of the machine's speed moves every figure alike and the ratios
// hold. Each row is an attention case (bench/cases/attn_case.h: shape, FLOPs, bytes), the cases
// the fused tests check; with `check` every timed fused case is first checked against the
// reference under the tests' accuracy rule. The CLI (src/cli/cmd_bench.cpp) parses the flags.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "bench/cases/attn_case.h"

namespace diffattn::bench {

struct AttentionBenchOptions {
  AttnCase base;                        // B, H (pairs), G, D, Dv of every row; causal
  int64_t T = 4096;                     // forward/backward rows
  int64_t ref_T = 512;                  // the rows that include the reference
  std::vector<int64_t> decode_T{32768};  // cached keys of the decode rows (rows for each)
  std::vector<int64_t> decode_B;        // batches of the decode rows (empty: base.B)
  int64_t rss_T = 16384;                // the peak-memory row (0: none)
  int rounds = 7;                       // timed rounds, after one warm-up round
  int64_t sgemm_n = 2048;               // the sgemm that measures the BLAS rate
  int64_t bandwidth_mb = 1024;          // the buffer that measures read bandwidth
  int64_t check_T = 256;                // with check: forward/backward cases at this length
  bool check = false, backward = true, decode_only = false, json = false;
  // The arguments (after the program) that make this program run rss_child(T, base) in a
  // fresh process and print its result: the peak-memory row. Empty: the row is not measured.
  std::function<std::vector<std::string>(int64_t T, const AttnCase& base)> rss_child_args;
};

// Runs the benchmark and prints the table (or JSON) to out, failed checks to err. Returns 1
// when a check failed, else 0.
int run_attention_bench(const AttentionBenchOptions& o, std::ostream& out, std::ostream& err);

// One causal forward of length T in this process, then its peak resident memory in MB on out.
int rss_child(int64_t T, const AttnCase& base, std::ostream& out);

}  // namespace diffattn::bench
