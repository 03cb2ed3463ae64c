// `diffattn exercises`: the textbook's exercises (seed 000) answered by the library on the
// worked example: Exercise 2 (d sum(out) / d lambda and its sign), Exercise 3 (a three-way
// split through the k-way reference), Exercise 4 (causal masking on both maps) and Exercise 5
// (the FLOPs behind "6.8B = 11B"). Exercise 1 is part of `diffattn demo`.
#include <cmath>
#include <iostream>

#include "cli/args.h"
#include "cli/table.h"
#include "diffattn/eval/exercises.h"
#include "diffattn/eval/textbook.h"
#include "diffattn/viz/viz.h"

namespace diffattn::cli {

namespace {

constexpr int T = eval::textbook::kTokens;

std::vector<std::string> words() { return {eval::textbook::kWords.begin(), eval::textbook::kWords.end()}; }

void two(std::ostream& os) {
  const eval::Exercise2 e = eval::exercise2();
  os << "== Exercise 2: gradient of sum(output) with respect to lambda (lambda = 0.4) ==\n\n";
  print_table(os, {"operator", "sum(output)", "d/d lambda", "finite difference"},
              {{"signed (the paper; library backward)", fixed(e.loss_signed),
                fixed(e.dlam_signed), fixed(e.dlam_signed_fd)},
               {"clamp + renormalise (the textbook's code)", fixed(e.loss_clamp),
                fixed(e.dlam_clamp), fixed(e.dlam_clamp_fd)}});
  os << "\nSigned: d sum(out)/d lambda = -sum(A2 V) = " << fixed(e.dlam_signed)
     << ". Every value row sums to 1\nexcept \"mat\" (2), so this is -(5 + sum of A2's \"mat\" "
        "column). Gradient\ndescent moves lambda against the gradient: with loss = sum(output) it would "
     << (e.dlam_signed < 0 ? "increase" : "decrease")
     << "\nlambda, subtracting more of map 2 because that lowers every output.\n"
        "Clamp mode (the textbook's PyTorch code): each row is renormalised to sum to 1, so the\n"
        "output sum only moves through the weight on \"mat\": d/d lambda = "
     << fixed(e.dlam_clamp) << ",\n"
     << (e.dlam_clamp < 0 ? "negative: descent would increase lambda"
                          : "positive: descent would decrease lambda")
     << ". Both are checked against central\ndifferences of the forward (h = 1e-2) and, in "
        "tests/python, against PyTorch autograd.\n";
}

void three(std::ostream& os) {
  const eval::Exercise3 e = eval::exercise3();
  const std::vector<std::string> tok = words();
  os << "\n== Exercise 3: a three-way split A1 - 0.3 A2 - 0.2 A3 ==\n\n"
        "Map 1 reads columns 0-1 of Q and K and map 2 columns 2-3, as in the two-way example; map\n"
        "3 reads columns 1-2 (the middle pair, which straddles both halves), scale 1/sqrt(2).\n"
        "Computed by the k-way reference (src/kernels/kway_ref.cpp).\n\n";
  print_matrix(os, "Map 3: A3 = softmax(Q[:,1:3] K[:,1:3]^T / sqrt(2))", tok, tok, e.map3.data());
  const eval::SplitSummary& s3 = e.splits[2];
  os << '\n';
  print_matrix(os, "Three-way, clamp mode: max(A1 - 0.3 A2 - 0.2 A3, 0) renormalised", tok, tok,
               s3.clamp.data());
  os << '\n';
  print_matrix(os, "Three-way, signed: A1 - 0.3 A2 - 0.2 A3", tok, tok, s3.signed_w.data());
  os << "\nSparsity against the two-way split:\n";
  std::vector<std::vector<std::string>> rows;
  for (const eval::SplitSummary& s : e.splits) {
    rows.push_back({s.name, std::to_string(s.zeros_clamp) + " / 25", fixed(s.max_clamp),
                    std::to_string(s.negatives_signed) + " / 25", fixed(s.negative_mass),
                    fixed(s.row_sum_signed)});
  }
  print_table(os, {"split", "zeros (clamp)", "max weight (clamp)", "negative (signed)",
                   "negative mass (signed)", "signed row sum"},
              rows);
  const eval::SplitSummary &s2 = e.splits[0], &s25 = e.splits[1];
  os << "\nThe three-way split gives " << s3.zeros_clamp << " exact zeros in clamp mode against "
     << s2.zeros_clamp << " for the two-way\nsplit at lambda = 0.4 and " << s25.zeros_clamp
     << " at lambda = 0.5 (the same total subtraction, 0.3 + 0.2); in signed mode\n"
     << s3.negatives_signed << " negative weights against " << s2.negatives_signed << " and "
     << s25.negatives_signed << ".\n"
     << (s3.zeros_clamp > s2.zeros_clamp ? "More sparsity than the textbook's two-way split"
                                         : "No more sparsity than the textbook's two-way split")
     << (s3.zeros_clamp > s25.zeros_clamp
             ? ",\nand more than a two-way split that subtracts as much."
             : s3.zeros_clamp == s25.zeros_clamp
                   ? ",\nbut no more than a two-way split that subtracts as much (lambda = 0.5)."
                   : ",\nand less than a two-way split that subtracts as much (lambda = 0.5).")
     << "\n";
}

void four(std::ostream& os) {
  const eval::Exercise4 e = eval::exercise4();
  const std::vector<std::string> tok = words();
  os << "\n== Exercise 4: causal masking applied to both maps (lambda = 0.4) ==\n\n";
  print_matrix(os, "Map 1, causal", tok, tok, e.signed_views.map1.data());
  os << '\n';
  print_matrix(os, "Map 2, causal", tok, tok, e.signed_views.map2.data());
  os << '\n';
  print_matrix(os, "Differential, signed: A1 - 0.4 A2 (mask before each softmax)", tok, tok,
               e.signed_views.diff.data());
  os << '\n';
  print_matrix(os, "Differential, clamp mode", tok, tok, e.clamp_views.diff.data());
  os << '\n';
  print_matrix(os, "Standard attention, causal", tok, tok, e.signed_views.standard.data());
  os << '\n';
  print_matrix(os, "Wrong order: unmasked A1 - 0.4 A2, future keys zeroed afterwards", tok, tok,
               e.mask_after.data());
  os << "\nrow sums, signed (mask first):  ";
  for (float x : e.signed_row_sums) os << fixed(x) << ' ';
  os << "\nrow sums, masked afterwards:    ";
  for (float x : e.mask_after_row_sums) os << fixed(x) << ' ';
  os << "\n\nThe mask must act inside each softmax: every row of each map then sums to 1 over the\n"
        "visible keys, and every signed row to 1 - lambda = 0.6, as without a mask. Masking the\n"
        "differential map afterwards is a different operator (largest difference "
     << fixed(e.max_difference)
     << "\nhere). The interaction differs from standard attention at the first rows: \"The\"\n"
        "sees only itself, so both maps put weight 1 on it and the signed weight is 1 - lambda =\n"
        "0.6 (clamp mode renormalises it to 1, like standard attention): with one visible key\n"
        "nothing can cancel, and a signed head only scales that token's value by 1 - lambda.\n";
}

void five(std::ostream& os) {
  const eval::Exercise5 e = eval::exercise5();
  os << "\n== Exercise 5: the FLOPs behind \"6.8B DIFF matches 11B standard\" ==\n\n"
     << "DIFF V1 at " << e.diff.config.n_layers << " layers (" << fixed(e.diff.params / 1e9, 3)
     << "B parameters)\nagainst standard at " << e.standard.config.n_layers << " layers ("
     << fixed(e.standard.params / 1e9, 3) << "B), d_model 4096, a causal 4096-token sequence:\n"
     << fixed(e.diff_seq_flops / 1e12, 2) << " against " << fixed(e.standard_seq_flops / 1e12, 2)
     << " TFLOP forward, " << fixed(100.0 * (1.0 - e.diff_seq_flops / e.standard_seq_flops), 1)
     << "% fewer.\n(Taking the paper's equivalence as given; `diffattn params --exercise5` shows "
        "the breakdown.)\n";
}

int run_exercises(const std::vector<std::string>& argv) {
  Args args("exercises",
            "The textbook's exercises answered by the library on the worked example: 2 (gradient\n"
            "of sum(output) with respect to lambda), 3 (three-way split), 4 (causal masking on both\n"
            "maps), 5 (FLOPs of 6.8B DIFF against 11B standard). Exercise 1 is in `diffattn demo`.");
  args.option("--only", "N", "", "print only exercise N (2, 3, 4 or 5)")
      .option("--out", "DIR", "", "also write heatmaps (PNG) and arrays (.npy) of the views here");
  if (!args.parse(argv)) return 0;
  const std::string only = args.str("--only");
  if (!only.empty() && only != "2" && only != "3" && only != "4" && only != "5") {
    throw UsageError("--only expects 2, 3, 4 or 5, got \"" + only + "\"");
  }
  if (only.empty() || only == "2") two(std::cout);
  if (only.empty() || only == "3") three(std::cout);
  if (only.empty() || only == "4") four(std::cout);
  if (only.empty() || only == "5") five(std::cout);
  if (args.given("--out")) {
    const std::string dir = args.str("--out");
    std::vector<std::string> written;
    auto add = [&](const std::vector<std::string>& w) { written.insert(written.end(), w.begin(), w.end()); };
    add(eval::export_views(eval::textbook_views(eval::textbook::kLambda, kernels::DiffMode::Clamp, false), dir, "textbook_clamp"));
    add(eval::export_views(eval::textbook_views(eval::textbook::kLambda, kernels::DiffMode::Signed, false), dir, "textbook_signed"));
    add(eval::export_views(eval::textbook_views(eval::textbook::kLambda, kernels::DiffMode::Signed, true), dir, "textbook_causal_signed"));
    const eval::Exercise3 e3 = eval::exercise3();
    viz::HeatmapSpec spec;
    spec.row_labels = spec.col_labels = words();
    spec.title = "Three-way split, signed: A1 - 0.3 A2 - 0.2 A3";
    spec.scale = viz::ColorScale::Diverging;
    viz::write_png(dir + "/three_way_signed.png", viz::render_heatmap(e3.splits[2].signed_w.data(), T, T, spec));
    viz::write_npy(dir + "/three_way_signed.npy", e3.splits[2].signed_w.data(), {T, T});
    spec.title = "Three-way split, clamp mode";
    spec.scale = viz::ColorScale::Sequential;
    viz::write_png(dir + "/three_way_clamp.png", viz::render_heatmap(e3.splits[2].clamp.data(), T, T, spec));
    viz::write_npy(dir + "/three_way_clamp.npy", e3.splits[2].clamp.data(), {T, T});
    add({dir + "/three_way_signed.png", dir + "/three_way_signed.npy", dir + "/three_way_clamp.png",
         dir + "/three_way_clamp.npy"});
    std::cout << "\nwrote " << written.size() << " files into " << dir << "/, among them:\n";
    for (const std::string& w : written) {
      if (w.find("_views.png") != std::string::npos || w.find("three_way_signed.png") != std::string::npos) {
        std::cout << "  " << w << "\n";
      }
    }
  }
  return 0;
}

const CommandRegistration reg({"exercises", "the textbook's exercises 2-5 answered by the library",
                               20, run_exercises});

}  // namespace

}  // namespace diffattn::cli
