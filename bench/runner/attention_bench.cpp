// The attention benchmark (attention_bench.h), moved here from the CLI's `bench` command.
#include "bench/runner/attention_bench.h"

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
#include "diffattn/base/text.h"
#include "diffattn/kernels/attention.h"
#include "diffattn/kernels/runtime.h"

extern char** environ;

namespace diffattn::bench {

namespace {

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
  std::vector<Comparison> checked;  // --check: the comparisons, at check_shape
  std::string check_shape;
  double median() const {
    std::vector<double> t = times;
    std::sort(t.begin(), t.end());
    return t.empty() ? 0 : t[t.size() / 2];
  }
  // The largest error over what the rule allows, over the checked tensors (ok when <= 1).
  double check_ratio() const {
    double r = 0;
    for (const Comparison& c : checked) r = std::max(r, c.bound > 0 ? c.err / c.bound : c.err);
    return r;
  }
  bool check_ok() const {
    return std::all_of(checked.begin(), checked.end(), [](const Comparison& c) { return c.ok(); });
  }
};

// The upstream recipe's forward of c at `seed` against the reference under the fused rule
// (the recipe runs our fused kernel twice and subtracts in float32).
std::vector<Comparison> check_recipe_fwd(const AttnCase& c, uint32_t seed) {
  Tensors t(c, seed, /*with_grads=*/false);
  UpstreamRecipe up(t);
  up.forward();
  const std::vector<float> got = t.out;
  std::vector<float> ref(got.size(), NAN), lse(t.lse.size()), o2(t.o2.size());
  kernels::AttnParams p = t.p;
  p.out = ref.data(), p.lse = lse.data(), p.o2 = o2.data();
  kernels::attention_fwd(p, kernels::Backend::Reference);
  return {compare("recipe out", got, ref, naive_fwd(t.p))};
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
double child_peak_rss_mb(int64_t T, const AttnCase& base, const AttentionBenchOptions& o) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0 || !o.rss_child_args) return -1;
  self[n] = '\0';
  std::vector<std::string> args{self};
  for (const std::string& a : o.rss_child_args(T, base)) args.push_back(a);
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

}  // namespace

int rss_child(int64_t T, const AttnCase& base, std::ostream& out) {
  AttnCase s = base.with_lengths(T, T);
  s.causal = true;
  Tensors t(s, 1, /*with_grads=*/false);
  kernels::attention_fwd(t.p);
  out << own_peak_rss_mb() << "\n";
  return 0;
}


int run_attention_bench(const AttentionBenchOptions& o, std::ostream& out, std::ostream& err) {
  const int threads = kernels::num_threads();
  const AttnCase& base = o.base;
  const bool decode_only = o.decode_only;
  const int64_t T = decode_only ? 0 : o.T, Tr = decode_only ? 0 : o.ref_T;
  const std::vector<int64_t>& Tds = o.decode_T;
  const std::vector<int64_t> Bds = o.decode_B.empty() ? std::vector<int64_t>{base.B} : o.decode_B;
  const int rounds = o.rounds;
  const bool check = o.check;
  const int64_t Tc = o.check_T;

  std::vector<std::unique_ptr<Tensors>> owned;
  std::vector<std::unique_ptr<UpstreamRecipe>> recipes;
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
  const bool bwd = o.backward;
  for (int64_t len : {T, Tr}) {
    if (len <= 0) continue;  // --decode-only: neither
    const bool with_ref = len == Tr;
    const AttnCase s = base.with_lengths(len, len);
    Tensors& d = tensors(s);
    Tensors& st = tensors(standard_equivalent(s));
    recipes.push_back(std::make_unique<UpstreamRecipe>(d));
    UpstreamRecipe& up = *recipes.back();
    add("fwd", "diff fused", d, Check::Forward, [&d] { kernels::attention_fwd(d.p); });
    add("fwd", "standard 2H heads", st, Check::Forward, [&st] { kernels::attention_fwd(st.p); });
    add("fwd", "upstream recipe", d, Check::RecipeForward, [&up] { up.forward(); });
    if (with_ref) add("fwd", "reference", d, Check::None, [&d] { kernels::attention_fwd(d.p, kernels::Backend::Reference); });
    Tensors* v2 = with_ref ? nullptr : &tensors(v2_equivalent(s));
    if (v2) add("fwd", "diff V2 fused", *v2, Check::Forward, [v2] { kernels::attention_fwd(v2->p); });
    if (bwd) {
      const kernels::AttnBwdParams db = d.bwd(), sb = st.bwd();
      add("bwd", "diff fused", d, Check::Backward, [db] { kernels::attention_bwd(db); });
      add("bwd", "standard 2H heads", st, Check::Backward, [sb] { kernels::attention_bwd(sb); });
      add("bwd", "upstream recipe", d, Check::None, [&up] { up.backward(); });
      if (v2) {
        const kernels::AttnBwdParams vb = v2->bwd();
        add("bwd", "diff V2 fused", *v2, Check::Backward, [vb] { kernels::attention_bwd(vb); });
      }
      if (with_ref) {
        add("bwd", "reference", d, Check::None, [db] { kernels::attention_bwd(db, kernels::Backend::Reference); });
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
      Tensors& st = tensors(standard_equivalent(s));
      add("decode", "diff fused", d, Check::Forward, [&d] { kernels::attention_fwd(d.p); });
      add("decode", "standard 2H heads", st, Check::Forward, [&st] { kernels::attention_fwd(st.p); });
      // The recipe reads V twice: its traffic is counted as the bytes it moves. It and the
      // reference are timed up to 64K cached keys in all (beyond, a round takes seconds).
      if (Bd * Td <= 65536) {
        recipes.push_back(std::make_unique<UpstreamRecipe>(d));
        UpstreamRecipe& up = *recipes.back();
        add("decode", "upstream recipe", d, Check::RecipeForward, [&up] { up.forward(); },
            s.kv_bytes() + s.v_bytes());
        add("decode", "reference", d, Check::None, [&d] { kernels::attention_fwd(d.p, kernels::Backend::Reference); });
      }
      Tensors& v2 = tensors(v2_equivalent(s));
      add("decode", "diff V2 fused", v2, Check::Forward, [&v2] { kernels::attention_fwd(v2.p); });
      // The same caches stored as BF16 and F16 (half the bytes; float32 arithmetic).
      for (const DType dt : {DType::BF16, DType::F16}) {
        for (const Tensors* t : {&d, &st, &v2}) {
          AttnCase c = t->c;
          c.kv_dtype = dt;
          Tensors& t16 = tensors(c);
          const std::string name =
              t == &d ? "diff fused" : t == &st ? "standard 2H heads" : "diff V2 fused";
          add("decode", name + " " + dtype_name(dt) + " kv", t16, Check::Forward,
              [&t16] { kernels::attention_fwd(t16.p); });
        }
      }
    }
  }

  // --check: each timed fused case once against the reference (the same case at most once),
  // forward/backward cases at length Tc (the reference at T = 4096 takes minutes).
  bool check_failed = false;
  if (check) {
    std::vector<std::pair<std::string, std::vector<Comparison>>> done;
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
                                   : check_case(c, 1, v.check == Check::Backward));
        it = done.end() - 1;
      }
      v.checked = it->second;
      v.check_shape = c.str();
      if (!v.check_ok()) {
        check_failed = true;
        for (const Comparison& x : v.checked) {
          if (!x.ok()) {
            err << "check failed: " << v.op << " " << v.variant << " (" << c.str()
                      << "): " << x.str() << "\n";
          }
        }
      }
    }
  }

  // Interleaved rounds: the machine's limits and every variant, once each per round.
  ReadBandwidth bw(o.bandwidth_mb << 20);
  const int64_t sn = o.sgemm_n;
  std::vector<double> sgemm, bandwidth;
  for (int r = 0; r <= rounds; ++r) {
    // Idle OpenMP workers spin a while before they sleep: let them sleep so sgemm has the
    // cores to itself, as the kernels have them after it.
    usleep(300000);
    const double g = sgemm_gflops(sn, threads);
    // OpenBLAS's worker threads spin for a while after a call before they sleep; on a
    // machine with few cores they would steal the next rows' cycles. Let them settle.
    usleep(300000);
    const double b = bw.measure(threads);
    if (r > 0) sgemm.push_back(g), bandwidth.push_back(b);
    for (Variant& v : rows) {
      if (v.op == "decode") bw.evict_caches();  // the cache read from memory, as in a model
      const double t = seconds_of(v.run);
      if (r > 0) v.times.push_back(t);
    }
  }
  const double sgemm_rate = median_of(sgemm), bw_rate = median_of(bandwidth);
  const int64_t rssT = decode_only ? 0 : o.rss_T;
  const double rss_mb = rssT > 0 ? child_peak_rss_mb(rssT, base, o) : 0;

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
  if (o.json) {
    nlohmann::json j;
    j["machine"] = {{"threads", threads},
                    {"simd_target", kernels::fused_simd_target()},
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
        for (const Comparison& x : v.checked) {
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
    out << j.dump(2) << "\n";
    return check_failed ? 1 : 0;
  }
  out << "threads " << threads << ", SIMD target " << kernels::fused_simd_target()
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
  print_table(out, header, body);
  if (rssT > 0) {
    const AttnCase rs = base.with_lengths(rssT, rssT);
    out << "\npeak RSS of a causal forward at T=" << rssT << " (" << rs.str()
              << ", inputs and outputs included, fresh process): "
              << (rss_mb >= 0 ? fixed(rss_mb, 1) + " MB" : std::string("not measured")) << "\n";
  }
  if (Tr > 0 && Tr != T) {
    out << "\nThe reference (double accumulation, plain loops) is timed at T=" << Tr
              << " only: at T=" << T << " one call takes minutes.\n";
  }
  if (check) {
    out << "\ncheck: the largest error over the bound of the tests' accuracy rule (ok <= 1),"
              << (decode_only ? std::string()
                              : " forward/backward cases at Tq=Tk=" + std::to_string(std::min(T, Tc)) + ",")
              << " decode cases at their size; "
              << (check_failed ? "FAILED (details on stderr)" : "every checked case passes") << ".\n";
  }
  return check_failed ? 1 : 0;
}

}  // namespace diffattn::bench
