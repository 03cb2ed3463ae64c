// `diffattn bench`: times the fused kernels beside their peers and this machine's limits, all
// measured in one run, in interleaved rounds (every variant once per round, medians quoted),
// so a drift of the machine's speed moves every figure alike and the ratios hold. Each row is
// an attention case (bench/cases/attn_case.h: shape, FLOPs, bytes), the cases the fused tests
// check; with --check every timed fused case is first checked against the reference under the
// tests' accuracy rule.
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/cases/attn_case.h"
#include "bench/cases/bench_cases.h"
#include "bench/cases/naive32.h"
#include "cli/args.h"
#include "cli/table.h"
#include "diffattn/kernels/attention.h"
#include "diffattn/kernels/runtime.h"

extern char** environ;

namespace diffattn::cli {

namespace {

using bench::AttnCase;
using bench::Tensors;

// What --check does with a row: the fused kernels' forward (and backward) against the
// reference, the upstream recipe's forward against the reference, or nothing (the reference
// itself, the recipe's backward, which writes the two maps' gradients apart).
enum class Check { None, Forward, Backward, RecipeForward };

// One timed variant: the case it runs, how to run it once, and what one run does (FLOPs or
// bytes, from the case).
struct Variant {
  int group = 0;  // rows of one comparison (the same operator and problem)
  std::string op, variant;
  AttnCase c;
  double flops = 0;  // compute-bound rows
  double bytes = 0;  // memory-bound rows (decode): K/V bytes read
  std::function<void()> run;
  Check check = Check::None;
  std::vector<double> times;
  std::vector<bench::Comparison> checked;  // --check: the comparisons, at check_shape
  std::string check_shape;
  double median() const {
    std::vector<double> t = times;
    std::sort(t.begin(), t.end());
    return t.empty() ? 0 : t[t.size() / 2];
  }
  // The largest error over what the rule allows, over the checked tensors (ok when <= 1).
  double check_ratio() const {
    double r = 0;
    for (const bench::Comparison& c : checked) r = std::max(r, c.bound > 0 ? c.err / c.bound : c.err);
    return r;
  }
  bool check_ok() const {
    return std::all_of(checked.begin(), checked.end(), [](const bench::Comparison& c) { return c.ok(); });
  }
};

// The upstream recipe's forward of c at `seed` against the reference under the fused rule
// (the recipe runs our fused kernel twice and subtracts in float32).
std::vector<bench::Comparison> check_recipe_fwd(const AttnCase& c, uint32_t seed) {
  Tensors t(c, seed, /*with_grads=*/false);
  bench::UpstreamRecipe up(t);
  up.forward();
  const std::vector<float> got = t.out;
  std::vector<float> ref(got.size(), NAN), lse(t.lse.size()), o2(t.o2.size());
  AttnParams p = t.p;
  p.out = ref.data(), p.lse = lse.data(), p.o2 = o2.data();
  attention_fwd(p, Backend::Reference);
  return {bench::compare("recipe out", got, ref, bench::naive_fwd(t.p))};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Peak resident memory (VmHWM) of this process, in MB; -1 when /proc cannot tell.
double own_peak_rss_mb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  return -1;
}

// Peak resident memory of a forward at sequence length T, in a fresh process (this one's peak
// already holds every other row's buffers): the child is this binary, `bench --rss-child T`,
// which prints its own VmHWM (the high-water mark of its address space after exec; the
// rusage of a spawned child would also count the parent's pages it started from).
double child_peak_rss_mb(int64_t T, const AttnCase& base) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  std::vector<std::string> args{self, "--threads", std::to_string(num_threads()), "bench",
                                "--rss-child", std::to_string(T),
                                "--B", std::to_string(base.B), "--H", std::to_string(base.H),
                                "--G", std::to_string(base.G), "--D", std::to_string(base.D),
                                "--Dv", std::to_string(base.Dv)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fd[2];
  if (pipe(fd) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd[1], 1);
  posix_spawn_file_actions_addclose(&actions, fd[0]);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fd[1]);
  std::string out;
  char buf[256];
  for (ssize_t got; rc == 0 && (got = read(fd[0], buf, sizeof(buf))) > 0;) out.append(buf, got);
  close(fd[0]);
  if (rc != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  try {
    return std::stod(out);
  } catch (const std::exception&) {
    return -1;
  }
}

int rss_child(int64_t T, const AttnCase& base) {
  AttnCase s = base.with_lengths(T, T);
  s.causal = true;
  Tensors t(s, 1, /*with_grads=*/false);
  attention_fwd(t.p);
  std::cout << own_peak_rss_mb() << "\n";
  return 0;
}

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
  AttnCase base;
  base.name = "diff";
  base.maps = 2;
  base.B = args.integer("--B");
  base.H = args.integer("--H");
  base.G = args.integer("--G");
  base.D = args.integer("--D");
  base.Dv = args.integer("--Dv");
  base.causal = true;
  if (args.integer("--rss-child") > 0) return rss_child(args.integer("--rss-child"), base);

  const int threads = num_threads();
  const bool decode_only = args.on("--decode-only");
  const int64_t T = decode_only ? 0 : args.integer("--T"), Tr = decode_only ? 0 : args.integer("--ref-T");
  const std::vector<int64_t> Tds = args.integers("--decode-T", 1, int64_t{1} << 24);
  const std::vector<int64_t> Bds = args.str("--decode-B").empty()
                                       ? std::vector<int64_t>{base.B}
                                       : args.integers("--decode-B", 1, 4096);
  const int rounds = static_cast<int>(args.integer("--rounds"));
  const bool check = args.on("--check");
  const int64_t Tc = args.integer("--check-T");
  if ((!decode_only && T < 1) || Tr < 0 || rounds < 1 || Tc < 1) {
    throw UsageError("sizes, --check-T and --rounds must be >= 1");
  }

  std::vector<std::unique_ptr<Tensors>> owned;
  std::vector<std::unique_ptr<bench::UpstreamRecipe>> recipes;
  std::vector<Variant> rows;
  auto tensors = [&](const AttnCase& c) -> Tensors& {
    owned.push_back(std::make_unique<Tensors>(c));
    return *owned.back();
  };
  int group = 0;
  // FLOPs (fwd, bwd) or bytes (decode) of a row come from its case; `bytes` overrides them
  // where a variant reads more than the case's K/V (the recipe reads V twice).
  auto add = [&](const std::string& op, const std::string& variant, const Tensors& t, Check chk,
                 std::function<void()> run, double bytes = 0) {
    if (variant == "diff fused") ++group;
    Variant v;
    v.group = group, v.op = op, v.variant = variant, v.c = t.c;
    v.flops = op == "fwd" ? t.c.fwd_flops() : op == "bwd" ? t.c.bwd_flops() : 0;
    v.bytes = op == "decode" ? (bytes > 0 ? bytes : t.c.kv_bytes()) : 0;
    v.run = std::move(run);
    v.check = chk;
    rows.push_back(std::move(v));
  };

  // Forward and backward: the differential operator, its standard peer of equal parameters,
  // the upstream two-call recipe (through our standard fused kernel).
  const bool bwd = !args.on("--no-backward");
  for (int64_t len : {T, Tr}) {
    if (len <= 0) continue;  // --decode-only: neither
    const bool with_ref = len == Tr;
    const AttnCase s = base.with_lengths(len, len);
    Tensors& d = tensors(s);
    Tensors& st = tensors(bench::standard_equivalent(s));
    recipes.push_back(std::make_unique<bench::UpstreamRecipe>(d));
    bench::UpstreamRecipe& up = *recipes.back();
    add("fwd", "diff fused", d, Check::Forward, [&d] { attention_fwd(d.p); });
    add("fwd", "standard 2H heads", st, Check::Forward, [&st] { attention_fwd(st.p); });
    add("fwd", "upstream recipe", d, Check::RecipeForward, [&up] { up.forward(); });
    if (with_ref) add("fwd", "reference", d, Check::None, [&d] { attention_fwd(d.p, Backend::Reference); });
    Tensors* v2 = with_ref ? nullptr : &tensors(bench::v2_equivalent(s));
    if (v2) add("fwd", "diff V2 fused", *v2, Check::Forward, [v2] { attention_fwd(v2->p); });
    if (bwd) {
      const AttnBwdParams db = d.bwd(), sb = st.bwd();
      add("bwd", "diff fused", d, Check::Backward, [db] { attention_bwd(db); });
      add("bwd", "standard 2H heads", st, Check::Backward, [sb] { attention_bwd(sb); });
      add("bwd", "upstream recipe", d, Check::None, [&up] { up.backward(); });
      if (v2) {
        const AttnBwdParams vb = v2->bwd();
        add("bwd", "diff V2 fused", *v2, Check::Backward, [vb] { attention_bwd(vb); });
      }
      if (with_ref) {
        add("bwd", "reference", d, Check::None, [db] { attention_bwd(db, Backend::Reference); });
      }
    }
    if (T == Tr) break;
  }
  // Decode: one new token against a cache of Td keys, for each length and batch.
  for (const int64_t Bd : Bds) {
    for (const int64_t Td : Tds) {
      AttnCase s = base.with_lengths(1, Td);
      s.B = Bd;
      Tensors& d = tensors(s);
      Tensors& st = tensors(bench::standard_equivalent(s));
      add("decode", "diff fused", d, Check::Forward, [&d] { attention_fwd(d.p); });
      add("decode", "standard 2H heads", st, Check::Forward, [&st] { attention_fwd(st.p); });
      // The recipe reads V twice: its traffic is counted as the bytes it moves. It and the
      // reference are timed up to 64K cached keys in all (beyond, a round takes seconds).
      if (Bd * Td <= 65536) {
        recipes.push_back(std::make_unique<bench::UpstreamRecipe>(d));
        bench::UpstreamRecipe& up = *recipes.back();
        add("decode", "upstream recipe", d, Check::RecipeForward, [&up] { up.forward(); },
            s.kv_bytes() + s.v_bytes());
        add("decode", "reference", d, Check::None, [&d] { attention_fwd(d.p, Backend::Reference); });
      }
      Tensors& v2 = tensors(bench::v2_equivalent(s));
      add("decode", "diff V2 fused", v2, Check::Forward, [&v2] { attention_fwd(v2.p); });
      // The same caches stored as BF16 and F16 (half the bytes; float32 arithmetic).
      for (const DType dt : {DType::BF16, DType::F16}) {
        for (const Tensors* t : {&d, &st, &v2}) {
          AttnCase c = t->c;
          c.kv_dtype = dt;
          Tensors& t16 = tensors(c);
          const std::string name =
              t == &d ? "diff fused" : t == &st ? "standard 2H heads" : "diff V2 fused";
          add("decode", name + " " + dtype_name(dt) + " kv", t16, Check::Forward,
              [&t16] { attention_fwd(t16.p); });
        }
      }
    }
  }

  // --check: each timed fused case once against the reference (the same case at most once),
  // forward/backward cases at length Tc (the reference at T = 4096 takes minutes).
  bool check_failed = false;
  if (check) {
    std::vector<std::pair<std::string, std::vector<bench::Comparison>>> done;
    for (Variant& v : rows) {
      if (v.check == Check::None) continue;
      AttnCase c = v.c;
      if (c.Tq > Tc) c = c.with_lengths(Tc, std::max<int64_t>(1, c.Tk - c.Tq + Tc));
      const std::string key = std::to_string(static_cast<int>(v.check)) + c.str() +
                              dtype_name(c.kv_dtype) + (c.maps == 2 && c.lam_per_token ? "t" : "");
      auto it = std::find_if(done.begin(), done.end(), [&](const auto& x) { return x.first == key; });
      if (it == done.end()) {
        done.emplace_back(key, v.check == Check::RecipeForward
                                   ? check_recipe_fwd(c, 1)
                                   : bench::check_case(c, 1, v.check == Check::Backward));
        it = done.end() - 1;
      }
      v.checked = it->second;
      v.check_shape = c.str();
      if (!v.check_ok()) {
        check_failed = true;
        for (const bench::Comparison& x : v.checked) {
          if (!x.ok()) {
            std::cerr << "check failed: " << v.op << " " << v.variant << " (" << c.str()
                      << "): " << x.str() << "\n";
          }
        }
      }
    }
  }

  // Interleaved rounds: the machine's limits and every variant, once each per round.
  bench::ReadBandwidth bw(args.integer("--bandwidth-mb") << 20);
  const int64_t sn = args.integer("--sgemm-n");
  std::vector<double> sgemm, bandwidth;
  for (int r = 0; r <= rounds; ++r) {
    // Idle OpenMP workers spin a while before they sleep: let them sleep so sgemm has the
    // cores to itself, as the kernels have them after it.
    usleep(300000);
    const double g = bench::sgemm_gflops(sn, threads);
    // OpenBLAS's worker threads spin for a while after a call before they sleep; on a
    // machine with few cores they would steal the next rows' cycles. Let them settle.
    usleep(300000);
    const double b = bw.measure(threads);
    if (r > 0) sgemm.push_back(g), bandwidth.push_back(b);
    for (Variant& v : rows) {
      if (v.op == "decode") bw.evict_caches();  // the cache read from memory, as in a model
      const double t = bench::seconds_of(v.run);
      if (r > 0) v.times.push_back(t);
    }
  }
  const double sgemm_rate = median_of(sgemm), bw_rate = median_of(bandwidth);
  const int64_t rssT = decode_only ? 0 : args.integer("--rss-T");
  const double rss_mb = rssT > 0 ? child_peak_rss_mb(rssT, base) : 0;

  // Ratios are taken round by round, then their median: a drift of the machine's speed
  // between rounds cancels. x limit: the rate over the sgemm rate (or read bandwidth) of the
  // same round; time / diff fused: over the fused differential kernel's time in the round.
  auto fused_of = [&](const Variant& v) -> const Variant& {
    for (const Variant& w : rows) {
      if (w.group == v.group && w.variant == "diff fused") return w;
    }
    return v;
  };
  auto x_limit = [&](const Variant& v) {
    std::vector<double> x;
    for (size_t r = 0; r < v.times.size(); ++r) {
      x.push_back(v.flops > 0 ? v.flops / v.times[r] * 1e-9 / sgemm[r]
                              : v.bytes / v.times[r] * 1e-9 / bandwidth[r]);
    }
    return median_of(x);
  };
  auto vs_fused = [&](const Variant& v) {
    const Variant& f = fused_of(v);
    std::vector<double> x;
    for (size_t r = 0; r < v.times.size(); ++r) x.push_back(v.times[r] / f.times[r]);
    return median_of(x);
  };
  if (args.on("--json")) {
    nlohmann::json j;
    j["machine"] = {{"threads", threads},
                    {"simd_target", fused_simd_target()},
                    {"sgemm_gflops", sgemm_rate},
                    {"sgemm_gflops_all", sgemm},
                    {"read_bandwidth_gbs_all", bandwidth},
                    {"sgemm_n", sn},
                    {"read_bandwidth_gbs", bw_rate},
                    {"rounds", rounds}};
    j["rows"] = nlohmann::json::array();
    for (const Variant& v : rows) {
      const double t = v.median();
      nlohmann::json row = {{"op", v.op}, {"variant", v.variant}, {"shape", v.c.str()},
                            {"causal", v.c.causal}, {"seconds", t},
                            {"seconds_all", v.times}, {"time_vs_diff_fused", vs_fused(v)}};
      if (v.flops > 0) {
        row["gflops"] = v.flops / t * 1e-9;
        row["x_sgemm"] = x_limit(v);
      }
      if (v.bytes > 0) {
        row["gbs"] = v.bytes / t * 1e-9;
        row["x_bandwidth"] = x_limit(v);
      }
      if (check && v.check != Check::None) {
        nlohmann::json tensors = nlohmann::json::array();
        for (const bench::Comparison& x : v.checked) {
          tensors.push_back({{"name", x.name}, {"ok", x.ok()}, {"error", x.err}, {"bound", x.bound}});
        }
        row["check"] = {{"ok", v.check_ok()}, {"error_over_bound", v.check_ratio()},
                        {"shape", v.check_shape}, {"tensors", tensors}};
      }
      j["rows"].push_back(row);
    }
    if (rssT > 0) {
      const AttnCase rs = base.with_lengths(rssT, rssT);
      j["peak_rss"] = {{"op", "fwd"}, {"causal", true}, {"shape", rs.str()}, {"mb", rss_mb}};
    }
    std::cout << j.dump(2) << "\n";
    return check_failed ? 1 : 0;
  }
  std::cout << "threads " << threads << ", SIMD target " << fused_simd_target()
            << ", medians of " << rounds << " interleaved rounds (ratios: per round, then median)\n"
            << "OpenBLAS sgemm " << sn << "^3: " << fixed(sgemm_rate, 1) << " GFLOP/s;  "
            << "memory read bandwidth: " << fixed(bw_rate, 1) << " GB/s\n\n";
  std::vector<std::vector<std::string>> body;
  for (const Variant& v : rows) {
    const double t = v.median();
    const double rate = v.flops > 0 ? v.flops / t * 1e-9 : v.bytes / t * 1e-9;
    body.push_back({v.op, v.variant, v.c.str(), v.c.causal ? "yes" : "no", fixed(t * 1e3, 2),
                    fixed(rate, 1) + (v.flops > 0 ? " GFLOP/s" : " GB/s"),
                    fixed(x_limit(v), 2) + (v.flops > 0 ? " sgemm" : " bw"),
                    fixed(vs_fused(v), 2)});
    if (check) {
      body.back().push_back(v.check == Check::None ? "-"
                                                   : (v.check_ok() ? "ok " : "FAIL ") +
                                                         fixed(v.check_ratio(), 3));
    }
  }
  std::vector<std::string> header{"op", "variant", "shape", "causal", "ms", "rate", "x limit",
                                  "time / diff fused"};
  if (check) header.push_back("check");
  print_table(std::cout, header, body);
  if (rssT > 0) {
    const AttnCase rs = base.with_lengths(rssT, rssT);
    std::cout << "\npeak RSS of a causal forward at T=" << rssT << " (" << rs.str()
              << ", inputs and outputs included, fresh process): "
              << (rss_mb >= 0 ? fixed(rss_mb, 1) + " MB" : std::string("not measured")) << "\n";
  }
  if (Tr > 0 && Tr != T) {
    std::cout << "\nThe reference (double accumulation, plain loops) is timed at T=" << Tr
              << " only: at T=" << T << " one call takes minutes.\n";
  }
  if (check) {
    std::cout << "\ncheck: the largest error over the bound of the tests' accuracy rule (ok <= 1),"
              << (decode_only ? std::string()
                              : " forward/backward cases at Tq=Tk=" + std::to_string(std::min(T, Tc)) + ",")
              << " decode cases at their size; "
              << (check_failed ? "FAILED (details on stderr)" : "every checked case passes") << ".\n";
  }
  return check_failed ? 1 : 0;
}

const CommandRegistration reg({"bench", "time the fused kernels against sgemm, bandwidth and peers",
                               40, run_bench});

}  // namespace

}  // namespace diffattn::cli
