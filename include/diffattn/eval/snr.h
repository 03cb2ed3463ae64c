// The signal-to-noise demonstration (seed 001, "Step 4", exercises 1 and 4), made precise.
//
// One query attends over N positions; position p holds the signal. Per trial, with q^ a random
// unit vector in R^D, q = sqrt(D) q^ for both maps and s = 1/sqrt(D), the keys are
//   map 1: k1_j = noise * n_j + independent * e1_j + signal * q^ [j == p]
//   map 2: k2_j = noise * n_j + independent * e2_j
// with n_j, e1_j, e2_j ~ N(0, I_D) independent. So the logits are
//   s q.k1_j = noise z_j + independent e1'_j + signal [j == p],   s q.k2_j = noise z_j + independent e2'_j
// z_j, e'_j ~ N(0, 1): a common-mode part shared by both maps, a small part of each map's own,
// and the signal in map 1 only. Standard attention is the same head without the subtraction
// (lambda = 0), computed by the standard operator on (q1, k1): a standard head of any width with
// the same signal and noise amplitudes has the same logits in distribution.
//
// SNR of a weight row w: w_p / mean_{j != p} |w_j| (the seed's definition: weight on the signal
// over the average weight on unrelated positions); also reported: w_p / std_{j != p} w_j.
// "Finds the signal": argmax_j w_j == p. Medians over trials; every map from the operators.
#pragma once

#include <cstdint>
#include <vector>

namespace diffattn::eval {

struct SnrConfig {
  int64_t length = 1024;     // N positions
  int64_t head_dim = 16;     // D
  double signal = 4.0;       // logit added to the signal key in map 1
  double noise = 1.0;        // common-mode noise amplitude (std of its logit)
  double independent = 0.3;  // each map's own noise amplitude
  double lambda = 0.8;       // lambda of the differential head (the paper's late-layer value)
  int trials = 32;
  uint64_t seed = 0;
};

struct SnrStats {
  double snr = 0;          // median over trials of w_p / mean |w_j|, j != p
  double snr_std = 0;      // median of w_p / std(w_j), j != p
  double found = 0;        // share of trials where argmax w == p
  double signal_weight = 0;  // median w_p
};

struct SnrLambdaPoint {
  double lambda = 0;
  SnrStats diff;
  double ratio = 0;  // median over trials of SNR_diff / SNR_standard (paired)
};

struct SnrNoisePoint {
  double noise = 0;
  SnrStats standard, diff;
};

struct SnrIndependentPoint {
  double independent = 0;
  double best_lambda = 0;  // lambda (on the sweep grid) maximising the median SNR
  double ratio_at_lambda = 0, ratio_at_best = 0;
};

struct SnrResult {
  SnrConfig config;
  SnrStats standard, diff;  // at config.lambda
  double ratio = 0;         // median paired SNR_diff / SNR_standard at config.lambda
  std::vector<SnrLambdaPoint> lambda_sweep;  // lambda 0 .. 1.2
  double best_lambda = 0;
  std::vector<SnrNoisePoint> noise_sweep;    // noise 0 .. 4 at config.lambda
  // Smallest swept noise amplitude where the signal is found in fewer than half the trials
  // (linearly interpolated between grid points); NaN when it never happens on the grid.
  double standard_breakdown = 0, diff_breakdown = 0;
  std::vector<SnrIndependentPoint> independent_sweep;
  // Trial 0 at config.lambda, for plots: weights over positions and the signal position.
  std::vector<float> example_standard, example_diff;
  int64_t example_position = 0;
};

// Runs the whole demonstration. Throws InvalidArgument for sizes or amplitudes out of range
// (length 2..65536, head_dim 1..256, trials 1..1000, finite amplitudes >= 0, finite lambda).
SnrResult run_snr(const SnrConfig& config, bool sweeps = true);

// One setting only (no sweeps): per-trial SNRs of standard and differential attention.
struct SnrTrials {
  std::vector<double> snr_standard, snr_diff, weight_standard, weight_diff;
  std::vector<int> found_standard, found_diff;
};
SnrTrials snr_trials(const SnrConfig& config);

}  // namespace diffattn::eval
