// The textbook's exercises (seed 000, Chapter 14.15) answered by the library on its worked
// example ("The cat sat on mat", include/diffattn/eval/textbook.h).
#pragma once

#include <string>
#include <vector>

#include "diffattn/eval/views.h"

namespace diffattn::eval {

// Exercise 2: d(sum of the output)/d lambda at lambda = 0.4, and its sign.
struct Exercise2 {
  double loss_signed = 0, loss_clamp = 0;  // sum of the output at lambda = 0.4
  double dlam_signed = 0;         // the library's backward (attention_bwd, dout = ones)
  double dlam_signed_fd = 0;      // central difference of the signed forward
  double dlam_clamp = 0;          // clamp mode (the textbook's code): chain rule over the maps
  double dlam_clamp_fd = 0;       // central difference of the clamp forward
};
Exercise2 exercise2();

// Exercise 3: a three-way split A1 - l1 A2 - l2 A3 (k-way reference), l1 = 0.3, l2 = 0.2.
// Map 3 reads columns 1-2 of Q and K (the middle pair, straddling both halves), so maps 1 and
// 2 are exactly the two-way example's.
struct SplitSummary {
  std::string name;
  std::vector<float> coef;      // c_m
  std::vector<float> clamp, signed_w;  // (5, 5) weights in each mode
  int zeros_clamp = 0;          // exact zeros after clamping
  int negatives_signed = 0;     // negative signed weights
  double negative_mass = 0;     // sum of |negative signed weights|
  double max_clamp = 0;         // largest clamped weight
  double row_sum_signed = 0;    // every row's signed sum, 1 - sum of lambdas
};
struct Exercise3 {
  std::vector<float> map3;      // (5, 5) softmax of the third map
  std::vector<SplitSummary> splits;  // two-way 0.4, two-way 0.5 (same total), three-way 0.3 + 0.2
};
Exercise3 exercise3();

// Exercise 4: the causal mask applied to both maps before the softmax, against standard causal
// attention and against masking the unmasked differential map afterwards.
struct Exercise4 {
  AttentionViews signed_views, clamp_views;  // causal
  std::vector<float> mask_after;   // (5, 5): non-causal A1 - 0.4 A2 with future keys zeroed
  std::vector<float> signed_row_sums, mask_after_row_sums;
  double max_difference = 0;       // max |mask before - mask after| over visible entries
};
Exercise4 exercise4();

}  // namespace diffattn::eval

#include "diffattn/eval/accounting.h"

namespace diffattn::eval {

// Exercise 5: the paper's "6.8B DIFF matches an 11B Transformer" taken as given, what it
// implies for FLOPs at d_model 4096 on a 4096-token sequence. Both models are shaped like the
// 7B example (32 heads of 128, ffn 11008, vocab 32000); the layer counts are those whose
// parameter counts come closest to 6.8B (DIFF V1) and 11B (standard).
struct Exercise5 {
  int64_t context = 4096;
  Accounting diff, standard;          // the 6.8B DIFF V1 and the 11B standard model
  Accounting diff_as_standard;        // the standard twin of the DIFF model (same layers)
  double diff_seq_flops = 0, standard_seq_flops = 0, twin_seq_flops = 0;  // whole sequence
};
Exercise5 exercise5();

}  // namespace diffattn::eval
