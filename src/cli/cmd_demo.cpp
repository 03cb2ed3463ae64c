// `diffattn demo`: the main job on built-in defaults. It opens with the textbook's worked
// example, computed by the library's operators and laid out as the textbook lays it out.
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

#include "cli/args.h"
#include "cli/demo.h"
#include "cli/table.h"
#include "diffattn/eval/textbook.h"
#include "diffattn/kernels/attention.h"

namespace diffattn::cli {

namespace {

constexpr int T = eval::textbook::kTokens;

std::vector<std::string> words() { return {eval::textbook::kWords.begin(), eval::textbook::kWords.end()}; }

// The example through the operator: out (T, Dv) and, from the saved lse, the maps (T, T).
struct ExampleRun {
  std::vector<float> out, a1, a2;
};

ExampleRun run_diff(float lam, kernels::DiffMode mode) {
  const float lam_arr[1] = {lam};
  kernels::AttnOptions opts;
  opts.mode = mode;
  kernels::AttnParams p = kernels::diff_attn_params({eval::textbook::kQ.data(), {1, T, 2, 2}},
                                  {eval::textbook::kK.data(), {1, T, 2, 2}},
                                  {eval::textbook::kV.data(), {1, T, 1, 4}}, {lam_arr, {1}}, opts);
  ExampleRun r;
  r.out.resize(T * 4);
  std::vector<float> lse(2 * T);
  p.out = r.out.data();
  p.lse = lse.data();
  kernels::attention_fwd(p);
  r.a1.resize(T * T);
  r.a2.resize(T * T);
  kernels::attention_probs(p, 0, r.a1.data());
  kernels::attention_probs(p, 1, r.a2.data());
  return r;
}

ExampleRun run_standard() {
  kernels::AttnParams p = kernels::attn_params({eval::textbook::kQ.data(), {1, T, 1, 4}},
                             {eval::textbook::kK.data(), {1, T, 1, 4}},
                             {eval::textbook::kV.data(), {1, T, 1, 4}}, kernels::AttnOptions{});
  ExampleRun r;
  r.out.resize(T * 4);
  std::vector<float> lse(T);
  p.out = r.out.data();
  p.lse = lse.data();
  kernels::attention_fwd(p);
  r.a1.resize(T * T);
  kernels::attention_probs(p, 0, r.a1.data());
  return r;
}

std::vector<float> weights(const ExampleRun& r, float lam, kernels::DiffMode mode) {
  std::vector<float> w(T * T);
  for (int i = 0; i < T; ++i) {
    kernels::diff_row_weights(&r.a1[i * T], &r.a2[i * T], lam, mode, T, &w[i * T]);
  }
  return w;
}

void worked_example(std::ostream& os) {
  const float lam = eval::textbook::kLambda;
  const std::vector<std::string> tok = words();
  const std::vector<std::string> dims{"d0", "d1", "d2", "d3"};
  os << "== 1. The textbook's worked example: \"The cat sat on mat\", lambda = 0.4 ==\n\n"
        "Q and K are 5x4: columns 0-1 drive map 1, columns 2-3 map 2 (two sub-heads of size\n"
        "D = 2, scale 1/sqrt(2)); V is 5x4 and shared by both maps.\n\n";
  print_matrix(os, "Q", tok, dims, eval::textbook::kQ.data(), 1);
  os << '\n';
  print_matrix(os, "K", tok, dims, eval::textbook::kK.data(), 1);
  os << '\n';
  print_matrix(os, "V", tok, dims, eval::textbook::kV.data(), 1);

  const ExampleRun clamp = run_diff(lam, kernels::DiffMode::Clamp);
  const ExampleRun std_run = run_standard();
  os << "\nStep 2: two separate attention maps\n";
  print_matrix(os, "Map 1: A1 = softmax(Q1 K1^T / sqrt(2))", tok, tok, clamp.a1.data());
  os << '\n';
  print_matrix(os, "Map 2: A2 = softmax(Q2 K2^T / sqrt(2))", tok, tok, clamp.a2.data());

  const std::vector<float> diff = weights(clamp, lam, kernels::DiffMode::Signed);
  std::vector<float> clamped(diff);
  std::vector<float> row_sum(T, 0.0f);
  for (int i = 0; i < T * T; ++i) {
    clamped[i] = std::max(clamped[i], 0.0f);
    row_sum[i / T] += clamped[i];
  }
  os << "\nStep 3: the differential map and the clamp\n";
  print_matrix(os, "D = A1 - 0.4 A2 (before clamping)", tok, tok, diff.data());
  os << '\n';
  print_matrix(os, "max(D, 0) (clamped)", tok, tok, clamped.data());
  os << "row sums:";
  for (int i = 0; i < T; ++i) os << ' ' << tok[i] << '=' << fixed(row_sum[i]);
  os << "\n\n";
  const std::vector<float> renorm = weights(clamp, lam, kernels::DiffMode::Clamp);
  print_matrix(os, "A_diff: clamped and renormalised weights (clamp mode)", tok, tok,
               renorm.data());
  os << '\n';
  print_matrix(os, "Standard attention weights: softmax(Q K^T / sqrt(4))", tok, tok,
               std_run.a1.data());

  os << "\nStep 4: output, differential (clamp mode) beside standard attention\n";
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < T; ++i) {
    std::vector<std::string> r{tok[i]};
    for (int d = 0; d < 4; ++d) r.push_back(fixed(clamp.out[i * 4 + d]));
    r.push_back("|");
    for (int d = 0; d < 4; ++d) r.push_back(fixed(std_run.out[i * 4 + d]));
    rows.push_back(r);
  }
  print_table(os, {"Token", "Diff d0", "Diff d1", "Diff d2", "Diff d3", "|", "Std d0", "Std d1",
                   "Std d2", "Std d3"},
              rows);

  const ExampleRun sgn = run_diff(lam, kernels::DiffMode::Signed);
  os << "\n== 2. The paper's signed operator on the same inputs (arXiv:2410.05258, Eq. 1) ==\n\n"
        "No clamp, no renormalisation: the weights A1 - lambda A2 keep their sign and each row\n"
        "sums to 1 - lambda = 0.6.\n\n";
  print_matrix(os, "Signed weights A1 - 0.4 A2", tok, tok, diff.data());
  os << '\n';
  print_matrix(os, "Output (A1 - 0.4 A2) V", tok, dims, sgn.out.data());
}

void exercise_one(std::ostream& os) {
  const std::vector<std::string> tok = words();
  const int cat = 1;
  os << "\n== 3. Exercise 1: lambda from 0 to 1 for the \"cat\" row (clamp mode) ==\n\n";
  std::vector<std::vector<std::string>> rows;
  int zeros_at_one = 0;
  for (int s = 0; s <= 10; ++s) {
    const float lam = 0.1f * s;
    const ExampleRun r = run_diff(lam, kernels::DiffMode::Clamp);
    std::vector<float> w(T);
    kernels::diff_row_weights(&r.a1[cat * T], &r.a2[cat * T], lam, kernels::DiffMode::Clamp, T, w.data());
    std::vector<std::string> row{fixed(lam, 1)};
    int zeros = 0;
    for (int j = 0; j < T; ++j) {
      row.push_back(fixed(w[j]));
      zeros += w[j] == 0.0f;
    }
    // The output row from the operator itself, so the table shows what the kernel computes.
    std::string out;
    for (int d = 0; d < 4; ++d) out += (d ? " " : "") + fixed(r.out[cat * 4 + d]);
    row.push_back(std::to_string(zeros));
    zeros_at_one = zeros;
    row.push_back(out);
    rows.push_back(row);
  }
  print_table(os, {"lambda", "The", "cat", "sat", "on", "mat", "zeros", "output row"}, rows);
  // D_j = A1_j - lambda A2_j first reaches zero at lambda = min_j A1_j / A2_j.
  const ExampleRun r = run_diff(0.0f, kernels::DiffMode::Clamp);
  double best = std::numeric_limits<double>::infinity();
  int at = -1;
  for (int j = 0; j < T; ++j) {
    const double ratio = static_cast<double>(r.a1[cat * T + j]) / r.a2[cat * T + j];
    if (ratio < best) {
      best = ratio;
      at = j;
    }
  }
  os << "\nThe first zero appears at lambda = A1[cat," << tok[at] << "] / A2[cat," << tok[at]
     << "] = " << fixed(best) << " (key \"" << tok[at] << "\"). Sparsity grows with lambda: no zero"
     << " at lambda = 0 (standard attention on half the width), " << zeros_at_one << " of " << T
     << " weights exactly zero at lambda = 1.\n";
}

int run_demo(const std::vector<std::string>& argv) {
  Args args("demo",
            "Run the main job on built-in defaults: the textbook's worked example computed by\n"
            "the library (both maps, the differential map, clamp and renormalisation, the output\n"
            "beside standard attention), the paper's signed result, and Exercise 1; then a tiny\n"
            "DIFF V1 language model and its standard twin trained on the King James Bible; last,\n"
            "multi-needle retrieval with DIFF V1, DIFF V2 and standard models (about two minutes),\n"
            "whose report, plots, heatmaps and models go to --out.");
  args.option("--out", "DIR", "diffattn-demo", "where the retrieval section writes its report and models")
      .option("--steps", "N", "1500",
              "training steps of each model in sections 4 and 5 (fewer: a quick look; the tables' "
              "numbers are then those of barely trained models)");
  if (!args.parse(argv)) return 0;
  const int64_t steps = args.integer("--steps", 1, 1000000);
  worked_example(std::cout);
  exercise_one(std::cout);
  demo_language_model(std::cout, 4, steps);
  demo_retrieval(std::cout, 5, args.str("--out") + "/retrieval", steps);
  return 0;
}

const CommandRegistration reg({"demo", "the worked example and the project's main job", 10,
                               run_demo});

}  // namespace

}  // namespace diffattn::cli
