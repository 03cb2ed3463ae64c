// The four views of one attention head that the explorer, the exercises and `diffattn maps`
// show: map 1, map 2, the differential map and standard attention, over the same tokens, all
// computed by the library's operators (the maps recomputed from the forward's saved lse).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diffattn/kernels/attention.h"

namespace diffattn::eval {

struct AttentionViews {
  std::string source;               // "textbook", "random", "model"
  std::string title;                // a model's views: what they show (model, layer, head)
  std::vector<std::string> tokens;  // T labels; queries and keys are the same tokens
  int64_t T = 0;
  float lambda = 0.0f;              // a model's views: the mean of the rows' lambdas
  bool lambda_varies = false;       // rows used different lambdas (V2: per token)
  kernels::DiffMode mode = kernels::DiffMode::Signed;
  bool causal = false;
  std::vector<float> map1, map2;  // (T, T) softmax(s Q1 K1^T), softmax(s Q2 K2^T)
  std::vector<float> diff;        // (T, T) A1 - lambda A2, or clamped and renormalised
  std::vector<float> standard;    // (T, T) softmax over the full width (both halves)
                                  // a standard model's views have only this one
  int64_t Dv = 0;
  std::vector<float> out_diff, out_standard;  // (T, Dv) the operators' outputs
};

// The textbook's worked example (include/diffattn/eval/textbook.h) at any lambda, mode and mask.
AttentionViews textbook_views(float lambda, kernels::DiffMode mode, bool causal);

// A seeded random head: T tokens named t0..t{T-1}, q and k (T, 2, D) and v (T, 2D) drawn from
// N(0, 1); standard attention reads the concatenated halves (width 2D), as in the textbook.
AttentionViews random_views(int64_t T, int64_t D, uint64_t seed, float lambda, kernels::DiffMode mode,
                            bool causal);

// The views of a differential head given its tensors: q, k (T, 2, D) sub-heads, v (T, Dv).
AttentionViews views_of(const std::vector<std::string>& tokens, const float* q, const float* k,
                        const float* v, int64_t D, int64_t Dv, float lambda, kernels::DiffMode mode,
                        bool causal);

// Writes each view as a heatmap PNG and a .npy (T, T) into dir (created if missing), named
// <stem>_map1, _map2, _diff, _standard, plus <stem>_views.png with the four side by side.
// Probability maps use a sequential colour map; the signed differential map a diverging one
// centred on zero. Returns the paths written.
std::vector<std::string> export_views(const AttentionViews& v, const std::string& dir,
                                      const std::string& stem);

}  // namespace diffattn::eval
