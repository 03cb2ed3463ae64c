// The textbook's exercises 2-4 (exercises.h), computed with the operator family and the k-way
// reference on the worked example.
#include "diffattn/eval/exercises.h"

#include <algorithm>
#include <cmath>

#include "diffattn/eval/textbook.h"
#include "diffattn/kernels/attention.h"
#include "diffattn/kernels/kway.h"

namespace diffattn::eval {

namespace {

constexpr int T = textbook::kTokens;
constexpr float kLam = textbook::kLambda;

// Sum of the differential output of the example at lambda in a mode, from the operator.
double output_sum(float lam, kernels::DiffMode mode) {
  const AttentionViews v = textbook_views(lam, mode, false);
  double s = 0;
  for (float x : v.out_diff) s += x;
  return s;
}

}  // namespace

Exercise2 exercise2() {
  Exercise2 e;
  e.loss_signed = output_sum(kLam, kernels::DiffMode::Signed);
  e.loss_clamp = output_sum(kLam, kernels::DiffMode::Clamp);

  // The library's backward with dout = 1 everywhere: dlam = -sum_i dout_i . (A2 V)_i.
  const float lam[1] = {kLam};
  kernels::AttnParams p = kernels::diff_attn_params({textbook::kQ.data(), {1, T, 2, 2}},
                                  {textbook::kK.data(), {1, T, 2, 2}},
                                  {textbook::kV.data(), {1, T, 1, 4}}, {lam, {1}}, kernels::AttnOptions{});
  std::vector<float> out(T * 4), lse(2 * T), o2(T * 4);
  p.out = out.data();
  p.lse = lse.data();
  p.o2 = o2.data();
  kernels::attention_fwd(p);
  kernels::AttnBwdParams bp(p);
  const std::vector<float> dout(T * 4, 1.0f);
  std::vector<float> dq(T * 4), dk(T * 4), dv(T * 4), dlam(1);
  bp.dout = dout.data();
  bp.dq = dq.data();
  bp.dk = dk.data();
  bp.dv = dv.data();
  bp.dlam = dlam.data();
  kernels::attention_bwd(bp);
  e.dlam_signed = dlam[0];

  // h well inside the nearest kink of clamp mode (a weight crossing zero at lambda 0.456).
  const float h = 1e-2f;
  e.dlam_signed_fd = (output_sum(kLam + h, kernels::DiffMode::Signed) - output_sum(kLam - h, kernels::DiffMode::Signed)) /
                     (2.0 * h);
  e.dlam_clamp_fd = (output_sum(kLam + h, kernels::DiffMode::Clamp) - output_sum(kLam - h, kernels::DiffMode::Clamp)) /
                    (2.0 * h);

  // Clamp mode: w_j = D_j / S with D_j = max(A1_j - lam A2_j, 0), S = sum_j D_j. On the active
  // set (D_j > 0) dD_j/dlam = -A2_j, so dw_j/dlam = (-A2_j + w_j sum_active A2_k) / S, and the
  // output sum of row i is sum_j w_j r_j with r_j the sum of value row j.
  const AttentionViews v = textbook_views(kLam, kernels::DiffMode::Clamp, false);
  double total = 0;
  for (int i = 0; i < T; ++i) {
    double S = 0, a2_active = 0;
    for (int j = 0; j < T; ++j) {
      const double d = static_cast<double>(v.map1[i * T + j]) - kLam * v.map2[i * T + j];
      if (d > 0) {
        S += d;
        a2_active += v.map2[i * T + j];
      }
    }
    for (int j = 0; j < T; ++j) {
      const double d = static_cast<double>(v.map1[i * T + j]) - kLam * v.map2[i * T + j];
      if (d <= 0) continue;
      double r = 0;
      for (int c = 0; c < 4; ++c) r += textbook::kV[j * 4 + c];
      total += r * (-v.map2[i * T + j] + (d / S) * a2_active) / S;
    }
  }
  e.dlam_clamp = total;
  return e;
}

Exercise3 exercise3() {
  // q, k as (1, T, 3, 2): map 1 = columns 0-1, map 2 = columns 2-3, map 3 = columns 1-2.
  std::vector<float> q3(T * 6), k3(T * 6);
  const int cols[3][2] = {{0, 1}, {2, 3}, {1, 2}};
  for (int t = 0; t < T; ++t) {
    for (int m = 0; m < 3; ++m) {
      for (int c = 0; c < 2; ++c) {
        q3[(t * 3 + m) * 2 + c] = textbook::kQ[t * 4 + cols[m][c]];
        k3[(t * 3 + m) * 2 + c] = textbook::kK[t * 4 + cols[m][c]];
      }
    }
  }
  Exercise3 e;
  auto run = [&](const std::string& name, const std::vector<float>& coef) {
    const int maps = static_cast<int>(coef.size());
    // The first `maps` maps of each row: copy the sub-heads the split uses.
    std::vector<float> q(T * maps * 2), k(T * maps * 2);
    for (int t = 0; t < T; ++t) {
      for (int m = 0; m < maps; ++m) {
        for (int c = 0; c < 2; ++c) {
          q[(t * maps + m) * 2 + c] = q3[(t * 3 + m) * 2 + c];
          k[(t * maps + m) * 2 + c] = k3[(t * 3 + m) * 2 + c];
        }
      }
    }
    SplitSummary s;
    s.name = name;
    s.coef = coef;
    std::vector<float> out(T * 4), probs(maps * T * T);
    for (kernels::DiffMode mode : {kernels::DiffMode::Clamp, kernels::DiffMode::Signed}) {
      kernels::AttnOptions o;
      o.mode = mode;
      kernels::KWayParams p = kernels::kway_params({q.data(), {1, T, maps, 2}}, {k.data(), {1, T, maps, 2}},
                                 {textbook::kV.data(), {1, T, 1, 4}},
                                 {coef.data(), {maps}}, maps, o);
      std::vector<float>& w = mode == kernels::DiffMode::Clamp ? s.clamp : s.signed_w;
      w.resize(T * T);
      p.out = out.data();
      p.probs = probs.data();
      p.weights = w.data();
      kernels::kway_attention_ref(p);
      if (maps == 3 && e.map3.empty()) e.map3.assign(probs.begin() + 2 * T * T, probs.end());
    }
    for (float x : s.clamp) {
      s.zeros_clamp += x == 0.0f;
      s.max_clamp = std::max<double>(s.max_clamp, x);
    }
    for (float x : s.signed_w) {
      if (x < 0) {
        ++s.negatives_signed;
        s.negative_mass -= x;
      }
    }
    for (int j = 0; j < T; ++j) s.row_sum_signed += s.signed_w[j];
    e.splits.push_back(s);
  };
  run("two-way, lambda = 0.4", {1.0f, -0.4f});
  run("two-way, lambda = 0.5", {1.0f, -0.5f});
  run("three-way, 0.3 and 0.2", {1.0f, -0.3f, -0.2f});
  return e;
}

Exercise4 exercise4() {
  Exercise4 e;
  e.signed_views = textbook_views(kLam, kernels::DiffMode::Signed, true);
  e.clamp_views = textbook_views(kLam, kernels::DiffMode::Clamp, true);
  const AttentionViews full = textbook_views(kLam, kernels::DiffMode::Signed, false);
  e.mask_after = full.diff;
  for (int i = 0; i < T; ++i) {
    double s1 = 0, s2 = 0;
    for (int j = 0; j < T; ++j) {
      if (j > i) e.mask_after[i * T + j] = 0.0f;
      s1 += e.signed_views.diff[i * T + j];
      s2 += e.mask_after[i * T + j];
      if (j <= i) {
        e.max_difference = std::max<double>(
            e.max_difference, std::abs(e.signed_views.diff[i * T + j] - e.mask_after[i * T + j]));
      }
    }
    e.signed_row_sums.push_back(static_cast<float>(s1));
    e.mask_after_row_sums.push_back(static_cast<float>(s2));
  }
  return e;
}

}  // namespace diffattn::eval

namespace diffattn::eval {

Exercise5 exercise5() {
  Exercise5 e;
  const model::ModelConfig b = example_7b();  // the 7B example's shapes at d_model 4096
  auto closest_layers = [&](const char* kind, double target) {
    int64_t best = 1;
    double best_err = INFINITY;
    for (int64_t L = 1; L <= 200; ++L) {
      model::ModelConfig s = b;
      s.n_layers = L;
      const model::ModelConfig c = std::string(kind) == "diff_v1" ? diff_v1_of(s) : s;
      const double err = std::abs(static_cast<double>(account(c, 1, 2).params) - target);
      if (err < best_err) {
        best_err = err;
        best = L;
      }
    }
    return best;
  };
  model::ModelConfig d = b, s = b;
  d.n_layers = closest_layers("diff_v1", 6.8e9);
  s.n_layers = closest_layers("standard", 11e9);
  e.diff = account(diff_v1_of(d), e.context, 2);
  e.standard = account(s, e.context, 2);
  e.diff_as_standard = account(d, e.context, 2);
  e.diff_seq_flops = sequence_flops(e.diff, e.context);
  e.standard_seq_flops = sequence_flops(e.standard, e.context);
  e.twin_seq_flops = sequence_flops(e.diff_as_standard, e.context);
  return e;
}

}  // namespace diffattn::eval
