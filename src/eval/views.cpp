// The four views of a head (views.h), computed by the operator family: one differential forward
// with saved lse gives map 1 and map 2 (attention_probs) and the output; one standard forward
// over the concatenated halves gives the standard map.
#include "diffattn/eval/views.h"

#include <algorithm>
#include <cmath>

#include "diffattn/base/rng.h"
#include "diffattn/eval/textbook.h"
#include "diffattn/viz/viz.h"

namespace diffattn::eval {

AttentionViews views_of(const std::vector<std::string>& tokens, const float* q, const float* k,
                        const float* v, int64_t D, int64_t Dv, float lambda, kernels::DiffMode mode,
                        bool causal) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  // A NaN or infinite lambda would give NaN maps, not an answer.
  if (!std::isfinite(lambda)) {
    throw InvalidArgument("views: lambda must be a finite number, got " + std::to_string(lambda));
  }
  AttentionViews r;
  r.tokens = tokens;
  r.T = T;
  r.lambda = lambda;
  r.mode = mode;
  r.causal = causal;
  r.Dv = Dv;
  kernels::AttnOptions opts;
  opts.mode = mode;
  opts.causal = causal;
  const float lam[1] = {lambda};
  kernels::AttnParams p = kernels::diff_attn_params({q, {1, T, 2, D}}, {k, {1, T, 2, D}}, {v, {1, T, 1, Dv}},
                                  {lam, {1}}, opts);
  std::vector<float> lse(static_cast<size_t>(2 * T));
  r.out_diff.resize(static_cast<size_t>(T * Dv));
  p.out = r.out_diff.data();
  p.lse = lse.data();
  kernels::attention_fwd(p);
  r.map1.resize(static_cast<size_t>(T * T));
  r.map2.resize(static_cast<size_t>(T * T));
  kernels::attention_probs(p, 0, r.map1.data());
  kernels::attention_probs(p, 1, r.map2.data());
  r.diff.resize(static_cast<size_t>(T * T));
  for (int64_t i = 0; i < T; ++i) {
    // Masked keys have zero probability in both maps, so their weight is zero in either mode.
    kernels::diff_row_weights(&r.map1[i * T], &r.map2[i * T], lambda, mode, T, &r.diff[i * T]);
  }
  // Standard attention reads both halves as one head of width 2D: (T, 2, D) is (T, 1, 2D).
  kernels::AttnOptions sopts;
  sopts.causal = causal;
  kernels::AttnParams s = kernels::attn_params({q, {1, T, 1, 2 * D}}, {k, {1, T, 1, 2 * D}}, {v, {1, T, 1, Dv}}, sopts);
  std::vector<float> slse(static_cast<size_t>(T));
  r.out_standard.resize(static_cast<size_t>(T * Dv));
  s.out = r.out_standard.data();
  s.lse = slse.data();
  kernels::attention_fwd(s);
  r.standard.resize(static_cast<size_t>(T * T));
  kernels::attention_probs(s, 0, r.standard.data());
  return r;
}

AttentionViews textbook_views(float lambda, kernels::DiffMode mode, bool causal) {
  const std::vector<std::string> tokens(textbook::kWords.begin(), textbook::kWords.end());
  AttentionViews r = views_of(tokens, textbook::kQ.data(), textbook::kK.data(),
                              textbook::kV.data(), 2, 4, lambda, mode, causal);
  r.source = "textbook";
  return r;
}

AttentionViews random_views(int64_t T, int64_t D, uint64_t seed, float lambda, kernels::DiffMode mode,
                            bool causal) {
  if (T < 1 || D < 1) {
    throw InvalidArgument("random_views: length and head size must be >= 1, got " +
                          std::to_string(T) + " and " + std::to_string(D));
  }
  Rng rng(seed);
  std::vector<float> q(static_cast<size_t>(T * 2 * D)), k(q.size()), v(static_cast<size_t>(T * 2 * D));
  for (float& x : q) x = static_cast<float>(rng.normal());
  for (float& x : k) x = static_cast<float>(rng.normal());
  for (float& x : v) x = static_cast<float>(rng.normal());
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < T; ++i) tokens.push_back("t" + std::to_string(i));
  AttentionViews r = views_of(tokens, q.data(), k.data(), v.data(), D, 2 * D, lambda, mode, causal);
  r.source = "random";
  return r;
}

std::vector<std::string> export_views(const AttentionViews& v, const std::string& dir,
                                      const std::string& stem) {
  viz::make_dirs(dir);
  char lam[32];
  std::snprintf(lam, sizeof lam, "%.3g", v.lambda);
  const std::string l = v.lambda_varies ? std::string("lambda_t") : std::string(lam);
  std::string diff_title = v.mode == kernels::DiffMode::Signed ? "A1 - " + l + " A2 (signed)"
                                                      : "max(A1 - " + l + " A2, 0), renormalised";
  if (v.lambda_varies) diff_title += ", lambda per row, mean " + std::string(lam);
  const bool model = v.source == "model";
  const std::string std_title = !model            ? "Standard: softmax(s Q K^T)"
                                : v.map1.empty()  ? "Softmax attention (the model's map)"
                                                  : "Standard view: softmax([q1;q2].[k1;k2] / sqrt(2D))";
  struct View {
    const char* name;
    std::string title;
    const std::vector<float>* data;
    viz::ColorScale scale;
  };
  const View views[] = {
      {"map1", "Map 1: softmax(s Q1 K1^T)", &v.map1, viz::ColorScale::Sequential},
      {"map2", "Map 2: softmax(s Q2 K2^T)", &v.map2, viz::ColorScale::Sequential},
      {"diff", diff_title,
       &v.diff, v.mode == kernels::DiffMode::Signed ? viz::ColorScale::Diverging : viz::ColorScale::Sequential},
      {"standard", std_title, &v.standard, viz::ColorScale::Sequential},
  };
  std::vector<std::string> written;
  std::vector<viz::Canvas> panels;
  for (const View& view : views) {
    if (view.data->empty()) continue;  // a standard model has one map
    viz::HeatmapSpec spec;
    spec.title = view.title;
    spec.row_labels = v.tokens;
    spec.col_labels = v.tokens;
    spec.scale = view.scale;
    viz::Canvas c = viz::render_heatmap(view.data->data(), static_cast<int>(v.T),
                                        static_cast<int>(v.T), spec);
    const std::string base = dir + "/" + stem + "_" + view.name;
    viz::write_png(base + ".png", c);
    viz::write_npy(base + ".npy", view.data->data(), {v.T, v.T});
    written.push_back(base + ".png");
    written.push_back(base + ".npy");
    panels.push_back(std::move(c));
  }
  const std::string all = dir + "/" + stem + "_views.png";
  const std::string title =
      !v.title.empty() ? v.title
                       : "Attention views (" + v.source + ", lambda = " + lam + (v.causal ? ", causal" : "") + ")";
  viz::write_png(all, viz::compose(panels, static_cast<int>(std::min<size_t>(panels.size(), 4)), title));
  written.push_back(all);
  return written;
}

}  // namespace diffattn::eval
