// The signal-to-noise demonstration (snr.h). Each trial is one batch row of the operators:
// q (trials, 1, 2, D), k (trials, N, 2, D), v (trials, N, 1, 1) holding 1 at the signal position,
// so the differential output is the signal weight itself; the maps come from attention_probs.
#include "diffattn/eval/snr.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "diffattn/base/rng.h"
#include "diffattn/kernels/attention.h"

namespace diffattn::eval {

namespace {

struct Batch {
  int64_t trials = 0, N = 0, D = 0;
  std::vector<int64_t> pos;       // signal position per trial
  std::vector<float> a1, a2, std; // (trials, N) map 1, map 2, standard
  std::vector<float> out_diff;    // (trials) the operator's output = signal weight at lambda
};

void check(const SnrConfig& c) {
  auto bad = [](const std::string& what) { throw InvalidArgument("snr: " + what); };
  if (c.length < 2 || c.length > 65536) bad("length must be 2..65536, got " + std::to_string(c.length));
  if (c.head_dim < 1 || c.head_dim > 256) bad("head_dim must be 1..256, got " + std::to_string(c.head_dim));
  if (c.trials < 1 || c.trials > 1000) bad("trials must be 1..1000, got " + std::to_string(c.trials));
  if (!std::isfinite(c.signal)) bad("signal must be finite");
  if (!(c.noise >= 0) || !std::isfinite(c.noise)) bad("noise must be a finite number >= 0");
  if (!(c.independent >= 0) || !std::isfinite(c.independent)) bad("independent must be a finite number >= 0");
  if (!std::isfinite(c.lambda)) bad("lambda must be finite");
}

// Draws the keys of every trial and runs the operators. The same seed gives the same noise draws
// for any amplitudes, so sweeps compare like with like.
Batch run_batch(const SnrConfig& c) {
  const int64_t B = c.trials, N = c.length, D = c.head_dim;
  Batch r;
  r.trials = B;
  r.N = N;
  r.D = D;
  std::vector<float> q(static_cast<size_t>(B * 2 * D)), k(static_cast<size_t>(B * N * 2 * D)),
      v(static_cast<size_t>(B * N), 0.0f);
  std::vector<double> n(static_cast<size_t>(D)), qhat(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b) {
    Rng rng(c.seed * 1000003ULL + static_cast<uint64_t>(b));
    double norm = 0;
    for (double& x : qhat) {
      x = rng.normal();
      norm += x * x;
    }
    norm = std::sqrt(norm);
    for (int64_t d = 0; d < D; ++d) {
      qhat[d] /= norm;
      q[(b * 2 + 0) * D + d] = static_cast<float>(std::sqrt(double(D)) * qhat[d]);
      q[(b * 2 + 1) * D + d] = static_cast<float>(std::sqrt(double(D)) * qhat[d]);
    }
    const int64_t p = static_cast<int64_t>(rng.below(static_cast<uint64_t>(N)));
    r.pos.push_back(p);
    v[b * N + p] = 1.0f;
    for (int64_t j = 0; j < N; ++j) {
      for (double& x : n) x = rng.normal();
      float* k1 = &k[((b * N + j) * 2 + 0) * D];
      float* k2 = &k[((b * N + j) * 2 + 1) * D];
      for (int64_t d = 0; d < D; ++d) {
        const double e1 = rng.normal(), e2 = rng.normal();
        k1[d] = static_cast<float>(c.noise * n[d] + c.independent * e1 +
                                   (j == p ? c.signal * qhat[d] : 0.0));
        k2[d] = static_cast<float>(c.noise * n[d] + c.independent * e2);
      }
    }
  }
  const float lam[1] = {static_cast<float>(c.lambda)};
  kernels::AttnParams p = kernels::diff_attn_params({q.data(), {B, 1, 2, D}}, {k.data(), {B, N, 2, D}},
                                  {v.data(), {B, N, 1, 1}}, {lam, {1}}, kernels::AttnOptions{});
  std::vector<float> lse(static_cast<size_t>(B * 2));
  r.out_diff.resize(static_cast<size_t>(B));
  p.out = r.out_diff.data();
  p.lse = lse.data();
  kernels::attention_fwd(p);
  r.a1.resize(static_cast<size_t>(B * N));
  r.a2.resize(static_cast<size_t>(B * N));
  kernels::attention_probs(p, 0, r.a1.data());
  kernels::attention_probs(p, 1, r.a2.data());
  // Standard attention: map 1's query and keys through the standard operator. The sub-head
  // stride of 2 is expressed as row strides into the same buffers.
  kernels::AttnParams s;
  s.B = B;
  s.Tq = 1;
  s.Tk = N;
  s.H = 1;
  s.G = 1;
  s.D = D;
  s.Dv = 1;
  s.maps = 1;
  s.scale = 1.0f / std::sqrt(static_cast<float>(D));
  s.q = q.data();
  s.k = k.data();
  s.v = v.data();
  s.set_contiguous_strides();
  s.q_batch_stride = 2 * D;
  s.q_row_stride = 2 * D;
  s.k_batch_stride = N * 2 * D;
  s.k_row_stride = 2 * D;
  std::vector<float> sout(static_cast<size_t>(B)), slse(static_cast<size_t>(B));
  s.out = sout.data();
  s.lse = slse.data();
  kernels::attention_fwd(s);
  r.std.resize(static_cast<size_t>(B * N));
  kernels::attention_probs(s, 0, r.std.data());
  return r;
}

double median(std::vector<double> x) {
  if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(x.begin(), x.end());
  const size_t m = x.size() / 2;
  return x.size() % 2 ? x[m] : 0.5 * (x[m - 1] + x[m]);
}

struct RowStats {
  double snr, snr_std, weight;
  bool found;
};

RowStats row_stats(const std::vector<double>& w, int64_t p) {
  const int64_t N = static_cast<int64_t>(w.size());
  double abs_sum = 0, sum = 0, sq = 0;
  int64_t arg = 0;
  for (int64_t j = 0; j < N; ++j) {
    if (w[j] > w[arg]) arg = j;
    if (j == p) continue;
    abs_sum += std::abs(w[j]);
    sum += w[j];
  }
  const double mean_abs = abs_sum / (N - 1), mean = sum / (N - 1);
  for (int64_t j = 0; j < N; ++j) {
    if (j != p) sq += (w[j] - mean) * (w[j] - mean);
  }
  const double sd = std::sqrt(sq / (N - 1));
  const double inf = std::numeric_limits<double>::infinity();
  return {mean_abs > 0 ? w[p] / mean_abs : (w[p] > 0 ? inf : 0.0), sd > 0 ? w[p] / sd : (w[p] > 0 ? inf : 0.0),
          w[p], arg == p};
}

// Row b's weights at lambda: A1 - lambda A2 (lambda_is_standard: the standard map).
std::vector<double> weights(const Batch& r, int64_t b, double lambda, bool standard) {
  std::vector<double> w(static_cast<size_t>(r.N));
  for (int64_t j = 0; j < r.N; ++j) {
    w[j] = standard ? r.std[b * r.N + j]
                    : static_cast<double>(r.a1[b * r.N + j]) - lambda * r.a2[b * r.N + j];
  }
  return w;
}

SnrStats summarise(const std::vector<RowStats>& rows) {
  std::vector<double> snr, sd, wt;
  double found = 0;
  for (const RowStats& s : rows) {
    snr.push_back(s.snr);
    sd.push_back(s.snr_std);
    wt.push_back(s.weight);
    found += s.found;
  }
  return {median(snr), median(sd), found / rows.size(), median(wt)};
}

// Standard and differential statistics of a batch at one lambda, and the paired ratio.
void stats_at(const Batch& r, double lambda, SnrStats& st, SnrStats& df, double& ratio) {
  std::vector<RowStats> rs, rd;
  std::vector<double> ratios;
  for (int64_t b = 0; b < r.trials; ++b) {
    rs.push_back(row_stats(weights(r, b, 0, true), r.pos[b]));
    rd.push_back(row_stats(weights(r, b, lambda, false), r.pos[b]));
    ratios.push_back(rd.back().snr / rs.back().snr);
  }
  st = summarise(rs);
  df = summarise(rd);
  ratio = median(ratios);
}

std::vector<double> lambda_grid() {
  std::vector<double> g;
  for (int i = 0; i <= 24; ++i) g.push_back(0.05 * i);
  return g;
}

// Smallest x where found(x) first drops below one half, interpolated; NaN if never.
double breakdown(const std::vector<double>& x, const std::vector<double>& found) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (found[i] < 0.5) {
      if (i == 0) return x[0];
      const double t = (found[i - 1] - 0.5) / (found[i - 1] - found[i]);
      return x[i - 1] + t * (x[i] - x[i - 1]);
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

SnrTrials snr_trials(const SnrConfig& config) {
  check(config);
  const Batch r = run_batch(config);
  SnrTrials t;
  for (int64_t b = 0; b < r.trials; ++b) {
    const RowStats s = row_stats(weights(r, b, 0, true), r.pos[b]);
    const RowStats d = row_stats(weights(r, b, config.lambda, false), r.pos[b]);
    t.snr_standard.push_back(s.snr);
    t.snr_diff.push_back(d.snr);
    t.weight_standard.push_back(s.weight);
    t.weight_diff.push_back(r.out_diff[b]);  // the operator's own output: v is the indicator of p
    t.found_standard.push_back(s.found);
    t.found_diff.push_back(d.found);
  }
  return t;
}

SnrResult run_snr(const SnrConfig& config, bool sweeps) {
  check(config);
  SnrResult res;
  res.config = config;
  const Batch base = run_batch(config);
  stats_at(base, config.lambda, res.standard, res.diff, res.ratio);
  res.example_position = base.pos[0];
  for (int64_t j = 0; j < base.N; ++j) {
    res.example_standard.push_back(base.std[j]);
    res.example_diff.push_back(base.a1[j] - static_cast<float>(config.lambda) * base.a2[j]);
  }
  if (!sweeps) return res;

  double best = -1;
  for (double lam : lambda_grid()) {
    SnrLambdaPoint pt;
    pt.lambda = lam;
    SnrStats st;
    stats_at(base, lam, st, pt.diff, pt.ratio);
    if (pt.diff.snr > best) {
      best = pt.diff.snr;
      res.best_lambda = lam;
    }
    res.lambda_sweep.push_back(pt);
  }

  std::vector<double> xs, fs, fd;
  for (int i = 0; i <= 16; ++i) {
    SnrConfig c = config;
    c.noise = 0.25 * i;
    const Batch r = run_batch(c);
    SnrNoisePoint pt;
    pt.noise = c.noise;
    double ratio = 0;
    stats_at(r, config.lambda, pt.standard, pt.diff, ratio);
    res.noise_sweep.push_back(pt);
    xs.push_back(pt.noise);
    fs.push_back(pt.standard.found);
    fd.push_back(pt.diff.found);
  }
  res.standard_breakdown = breakdown(xs, fs);
  res.diff_breakdown = breakdown(xs, fd);

  for (double ind : {0.0, 0.1, 0.3, 0.5, 1.0}) {
    SnrConfig c = config;
    c.independent = ind;
    const Batch r = run_batch(c);
    SnrIndependentPoint pt;
    pt.independent = ind;
    SnrStats st, df;
    stats_at(r, config.lambda, st, df, pt.ratio_at_lambda);
    double best_snr = -1;
    for (double lam : lambda_grid()) {
      double ratio = 0;
      stats_at(r, lam, st, df, ratio);
      if (df.snr > best_snr) {
        best_snr = df.snr;
        pt.best_lambda = lam;
        pt.ratio_at_best = ratio;
      }
    }
    res.independent_sweep.push_back(pt);
  }
  return res;
}

}  // namespace diffattn::eval
