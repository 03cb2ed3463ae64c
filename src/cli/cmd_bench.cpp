// `diffattn bench`: the flags of the attention benchmark, which lives in
// bench/runner/attention_bench.{h,cpp} (the fused kernels beside their peers and this machine's
// limits, measured in one run in interleaved rounds).
#include <iostream>
#include <string>
#include <vector>

#include "bench/runner/attention_bench.h"
#include "cli/args.h"
#include "diffattn/kernels/runtime.h"

namespace diffattn::cli {

namespace {

int run_bench(const std::vector<std::string>& argv) {
  Args args("bench",
            "Time the fused kernels beside their peers, with this machine's OpenBLAS sgemm rate\n"
            "and memory read bandwidth measured in the same run. Compute-bound rows (forward,\n"
            "backward) report GFLOP/s counted as FlashAttention counts (backward = 2.5 x forward)\n"
            "and the ratio to sgemm; decode rows report K/V bytes read per second and the ratio\n"
            "to the read bandwidth (each decode call starts with the caches evicted, as a step of\n"
            "a many-layer model finds them). Each row's time is the median over the rounds; every\n"
            "variant runs once per round, interleaved. Beside each V1 row (\"diff fused\"): standard\n"
            "attention of equal parameters (2H heads of size D), the upstream two-call recipe,\n"
            "the reference (at --ref-T), and DIFF V2 of the same model size (2H output heads of\n"
            "4H query heads, 2G key/value heads of size D shared by both maps, lambda per token:\n"
            "twice the standard FLOPs, the same cache bytes). The decode rows are repeated with the\n"
            "K/V cache stored as BF16 and F16 (\"... BF16 kv\": half the bytes read).\n"
            "Every row is an attention case of bench/cases/attn_case.h, the cases the fused tests\n"
            "check. --check first runs each timed fused case (and the recipe's forward) once\n"
            "against the reference under the tests' accuracy rule (error at most 8x a naive\n"
            "float32 computation's, plus 32 eps of the values' size; 16-bit K/V: at most 2x a\n"
            "plain computation in that type), the forward/backward rows at --check-T, decode\n"
            "rows at their own size, adds the column \"check\" (worst error / bound) and exits\n"
            "with status 1 if a case fails.");
  args.option("--T", "N", "4096", "sequence length of the forward/backward rows")
      .option("--B", "N", "1", "batch")
      .option("--H", "N", "4", "differential pairs (the standard peer has 2H heads)")
      .option("--G", "N", "4", "key/value groups")
      .option("--D", "N", "64", "query/key head size")
      .option("--Dv", "N", "128", "value head size (V1: 2D)")
      .option("--decode-T", "N[,N...]", "32768", "cached keys of the decode rows (a list: rows for each)")
      .option("--decode-B", "N[,N...]", "", "batch of the decode rows (a list; default: --B)")
      .option("--ref-T", "N", "512", "sequence length of the rows that include the reference")
      .option("--rss-T", "N", "16384", "sequence length of the peak-memory row (0: skip)")
      .option("--rounds", "N", "7", "timed rounds (after one warm-up round)")
      .option("--sgemm-n", "N", "2048", "size of the sgemm that measures the BLAS rate")
      .option("--bandwidth-mb", "N", "1024", "size of the buffer that measures read bandwidth")
      .option("--rss-child", "T", "0", "(internal) run one forward of length T and exit")
      .option("--check-T", "N", "256", "with --check: length of the checked forward/backward cases")
      .flag("--check", "check every timed fused case against the reference first (see above)")
      .flag("--no-backward", "skip the backward rows")
      .flag("--decode-only", "time the decode rows only (no forward, backward or peak-memory row)")
      .flag("--json", "print JSON instead of the table");
  if (!args.parse(argv)) return 0;
  bench::AttentionBenchOptions o;
  bench::AttnCase& base = o.base;
  base.name = "diff";
  base.maps = 2;
  base.B = args.integer("--B", 1, int64_t{1} << 20);
  base.H = args.integer("--H", 1, int64_t{1} << 20);
  base.G = args.integer("--G", 1, int64_t{1} << 20);
  base.D = args.integer("--D", 1, int64_t{1} << 20);
  base.Dv = args.integer("--Dv", 1, int64_t{1} << 20);
  base.causal = true;
  if (args.integer("--rss-child") > 0) return bench::rss_child(args.integer("--rss-child"), base, std::cout);

  o.decode_only = args.on("--decode-only");
  o.T = o.decode_only ? 0 : args.integer("--T");
  o.ref_T = o.decode_only ? 0 : args.integer("--ref-T");
  o.decode_T = args.integers("--decode-T", 1, int64_t{1} << 24);
  if (!args.str("--decode-B").empty()) o.decode_B = args.integers("--decode-B", 1, 4096);
  o.rounds = static_cast<int>(args.integer("--rounds"));
  o.check = args.on("--check");
  o.check_T = args.integer("--check-T");
  if ((!o.decode_only && o.T < 1) || o.ref_T < 0 || o.rounds < 1 || o.check_T < 1) {
    throw UsageError("sizes, --check-T and --rounds must be >= 1");
  }
  o.backward = !args.on("--no-backward");
  o.json = args.on("--json");
  o.bandwidth_mb = args.integer("--bandwidth-mb", 1, int64_t{1} << 20);
  o.sgemm_n = args.integer("--sgemm-n", 1, int64_t{1} << 16);
  o.rss_T = args.integer("--rss-T", 0, int64_t{1} << 30);
  // The peak-memory row: this tool again, `bench --rss-child T` with the same sizes.
  o.rss_child_args = [](int64_t T, const bench::AttnCase& b) {
    return std::vector<std::string>{"--threads", std::to_string(kernels::num_threads()), "bench", "--rss-child",
                                    std::to_string(T), "--B", std::to_string(b.B), "--H", std::to_string(b.H),
                                    "--G", std::to_string(b.G), "--D", std::to_string(b.D),
                                    "--Dv", std::to_string(b.Dv)};
  };
  return bench::run_attention_bench(o, std::cout, std::cerr);
}


const CommandRegistration reg({"bench", "time the fused kernels against sgemm, bandwidth and peers",
                               40, run_bench});

}  // namespace

}  // namespace diffattn::cli
