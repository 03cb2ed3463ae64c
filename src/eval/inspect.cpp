// Maps of a trained model (inspect.h): every map comes from attention_probs over the views and
// the saved lse that TrainContext::layer_attention exposes after a forward; only the full-width
// standard view of a DIFF pair needs one more forward of its own (a standard head of width 2D).
// The attention-noise analysis reads the answer rows of those maps on retrieval samples.
#include "diffattn/eval/inspect.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace diffattn::eval {

namespace {

// The call restricted to sequence b of the batch.
kernels::AttnBwdParams batch_slice(kernels::AttnBwdParams p, int64_t b) {
  p.q += b * p.q_batch_stride;
  p.k = p.kf() + b * p.k_batch_stride;
  p.v = p.vf() + b * p.v_batch_stride;
  p.out += b * p.o_batch_stride;
  p.lse += b * p.q_heads() * p.Tq;
  if (p.lam_per_token) p.lam += b * p.Tq * p.H;
  p.B = 1;
  return p;
}

// softmax([q1;q2].[k1;k2] / sqrt(2D)) of every pair of a one-sequence call: (H, T, T).
void full_width_standard(const kernels::AttnProblem& p, float* probs) {
  const int64_t T = p.Tq, H = p.H, G = p.G, D = p.D, Dv = p.Dv;
  std::vector<float> q(static_cast<size_t>(T * H * 2 * D)), k(static_cast<size_t>(T * G * 2 * D)),
      v(static_cast<size_t>(T * G * Dv));
  for (int64_t t = 0; t < T; ++t) {
    // Sub-heads 2h and 2h+1 of a row are adjacent: pair h's [q1; q2] is 2D contiguous floats.
    std::memcpy(&q[static_cast<size_t>(t * H * 2 * D)], p.q + t * p.q_row_stride,
                sizeof(float) * static_cast<size_t>(H * 2 * D));
    const float* kr = p.kf() + t * p.k_row_stride;
    for (int64_t g = 0; g < G; ++g) {
      float* dst = &k[static_cast<size_t>((t * G + g) * 2 * D)];
      if (p.shared_keys) {  // V2: both maps read key head g
        std::memcpy(dst, kr + g * D, sizeof(float) * static_cast<size_t>(D));
        std::memcpy(dst + D, kr + g * D, sizeof(float) * static_cast<size_t>(D));
      } else {              // V1: key sub-heads 2g and 2g+1 are adjacent
        std::memcpy(dst, kr + g * 2 * D, sizeof(float) * static_cast<size_t>(2 * D));
      }
    }
    std::memcpy(&v[static_cast<size_t>(t * G * Dv)], p.vf() + t * p.v_row_stride,
                sizeof(float) * static_cast<size_t>(G * Dv));
  }
  kernels::AttnOptions o;
  o.causal = p.causal;  // scale 0: 1/sqrt(2D), the full width's
  kernels::AttnParams s = kernels::attn_params({q.data(), {1, T, H, 2 * D}}, {k.data(), {1, T, G, 2 * D}},
                             {v.data(), {1, T, G, Dv}}, o);
  std::vector<float> out(static_cast<size_t>(T * H * Dv)), lse(static_cast<size_t>(H * T));
  s.out = out.data();
  s.lse = lse.data();
  kernels::attention_fwd(s);
  kernels::attention_probs(s, 0, probs);
}

void add_scaled(std::vector<float>& acc, const float* x, size_t n, float w) {
  for (size_t i = 0; i < n; ++i) acc[i] += w * x[i];
}

}  // namespace

LayerMaps layer_maps(const model::TrainContext& run, int64_t layer, int64_t b, const MapOptions& o) {
  const model::TrainContext::LayerAttention la = run.layer_attention(layer);
  if (b < 0 || b >= la.params.B) {
    throw InvalidArgument("layer_maps: sequence " + std::to_string(b) + " is outside the last forward's batch of " +
                          std::to_string(la.params.B));
  }
  const kernels::AttnBwdParams p = batch_slice(la.params, b);
  LayerMaps r;
  r.kind = la.shape.kind;
  r.layer = layer;
  r.H = p.H;
  r.T = p.Tq;
  const int64_t H = p.H, T = p.Tq;
  const size_t n = static_cast<size_t>(H * T * T);
  if (p.maps == 1) {
    r.standard.resize(n);
    kernels::attention_probs(p, 0, r.standard.data());
    return r;
  }
  r.map1.resize(n);
  r.map2.resize(n);
  r.diff.resize(n);
  kernels::attention_probs(p, 0, r.map1.data());
  kernels::attention_probs(p, 1, r.map2.data());
  r.lambda.resize(static_cast<size_t>(H * T));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      const float lam = !std::isnan(o.lambda) ? static_cast<float>(o.lambda)
                        : p.lam_per_token     ? p.lam[i * H + h]
                                              : p.lam[p.lam_scalar ? 0 : h];
      r.lambda[static_cast<size_t>(h * T + i)] = lam;
      const size_t row = static_cast<size_t>((h * T + i) * T);
      kernels::diff_row_weights(&r.map1[row], &r.map2[row], lam, o.mode, T, &r.diff[row]);
    }
  }
  if (o.with_standard) {
    r.standard.resize(n);
    full_width_standard(p, r.standard.data());
  }
  return r;
}

AttentionViews head_views(const LayerMaps& maps, int64_t head, const std::vector<std::string>& tokens) {
  const int64_t H = maps.H, T = maps.T;
  if (head < -1 || head >= H) {
    throw InvalidArgument("head " + std::to_string(head) + " is outside [0, " + std::to_string(H) +
                          ") (layer " + std::to_string(maps.layer) + ")");
  }
  if (static_cast<int64_t>(tokens.size()) != T) {
    throw InvalidArgument("head_views: " + std::to_string(tokens.size()) + " token labels for " +
                          std::to_string(T) + " positions");
  }
  AttentionViews v;
  v.source = "model";
  v.tokens = tokens;
  v.T = T;
  v.causal = true;
  const size_t tt = static_cast<size_t>(T * T);
  const int64_t h0 = head < 0 ? 0 : head, h1 = head < 0 ? H : head + 1;
  const float w = 1.0f / static_cast<float>(h1 - h0);
  auto pick = [&](const std::vector<float>& all, std::vector<float>& dst) {
    if (all.empty()) return;
    dst.assign(tt, 0.0f);
    for (int64_t h = h0; h < h1; ++h) add_scaled(dst, &all[static_cast<size_t>(h) * tt], tt, w);
  };
  pick(maps.map1, v.map1);
  pick(maps.map2, v.map2);
  pick(maps.diff, v.diff);
  pick(maps.standard, v.standard);
  if (!maps.lambda.empty()) {
    double s = 0, lo = INFINITY, hi = -INFINITY;
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const double l = maps.lambda[static_cast<size_t>(h * T + i)];
        s += l;
        lo = std::min(lo, l);
        hi = std::max(hi, l);
      }
    }
    v.lambda = static_cast<float>(s / static_cast<double>((h1 - h0) * T));
    v.lambda_varies = hi > lo;
  }
  return v;
}

AttentionViews mean_views(const std::vector<AttentionViews>& views) {
  if (views.empty()) throw InvalidArgument("mean_views: no views");
  AttentionViews r = views[0];
  const float w = 1.0f / static_cast<float>(views.size());
  double lam = 0;
  for (std::vector<float>* f : {&r.map1, &r.map2, &r.diff, &r.standard}) {
    for (float& x : *f) x = 0.0f;
  }
  for (const AttentionViews& v : views) {
    if (v.T != r.T || v.map1.size() != r.map1.size() || v.standard.size() != r.standard.size()) {
      throw InvalidArgument("mean_views: views of different sizes or kinds");
    }
    add_scaled(r.map1, v.map1.data(), v.map1.size(), w);
    add_scaled(r.map2, v.map2.data(), v.map2.size(), w);
    add_scaled(r.diff, v.diff.data(), v.diff.size(), w);
    add_scaled(r.standard, v.standard.data(), v.standard.size(), w);
    lam += v.lambda;
    r.lambda_varies = r.lambda_varies || v.lambda_varies || v.lambda != views[0].lambda;
  }
  r.lambda = static_cast<float>(lam / static_cast<double>(views.size()));
  return r;
}

std::vector<std::string> byte_labels(const std::vector<int32_t>& tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  for (int32_t t : tokens) out.emplace_back(1, static_cast<char>(t & 0xff));
  return out;
}

// ---- attention noise ----

NoiseStats row_noise(const float* w, int64_t n, int64_t context, int64_t answer_begin,
                     int64_t answer_end) {
  double total = 0, answer = 0, noise = 0, noise_abs = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double x = w[j];
    total += std::abs(x);
    if (j >= answer_begin && j < answer_end) {
      answer += x;
    } else if (j < context) {
      noise += x;
      noise_abs += std::abs(x);
    }
  }
  NoiseStats s;
  if (total > 0) {
    s.answer = answer / total;
    s.noise = noise / total;
    s.noise_abs = noise_abs / total;
  }
  return s;
}

namespace {

void accumulate(NoiseStats& acc, const NoiseStats& s) {
  acc.answer += s.answer;
  acc.noise += s.noise;
  acc.noise_abs += s.noise_abs;
}

void scale(NoiseStats& s, double f) {
  s.answer *= f;
  s.noise *= f;
  s.noise_abs *= f;
}

}  // namespace

NoiseAnalysis analyze_noise(model::TrainContext& run, const data::RetrievalSpec& spec, int64_t samples,
                            int64_t batch) {
  spec.validate();
  if (samples < 1 || batch < 1) {
    throw InvalidArgument("analyze_noise: samples and batch must be >= 1, got " + std::to_string(samples) +
                          " and " + std::to_string(batch));
  }
  const model::ModelConfig& cfg = run.model().config();
  const int64_t L = cfg.n_layers, V = cfg.vocab_size;
  NoiseAnalysis r;
  r.kind = cfg.attention;
  r.samples = samples;
  r.layers.resize(static_cast<size_t>(L));
  std::vector<double> lam_sum(static_cast<size_t>(L), 0.0);
  int64_t rows = 0, correct = 0, answers = 0;
  MapOptions mo;
  mo.with_standard = false;
  for (int64_t s0 = 0; s0 < samples; s0 += batch) {
    const int64_t B = std::min(batch, samples - s0);
    const data::RetrievalBatch rb = data::make_retrieval_batch(spec, static_cast<uint64_t>(s0), B);
    const std::vector<data::RetrievalSample>& ss = rb.samples;
    const int64_t T = rb.T;
    if (T > cfg.max_seq_len) {
      throw InvalidArgument("analyze_noise: samples of " + std::to_string(T) + " tokens exceed the model's max_seq_len = " +
                            std::to_string(cfg.max_seq_len));
    }
    run.forward(rb.tokens.data(), nullptr, B, T);
    for (int64_t b = 0; b < B; ++b) {
      const data::RetrievalSample& smp = ss[static_cast<size_t>(b)];
      for (const data::RetrievalQuery& q : smp.queries) {
        const float* lg = &run.logits()[static_cast<size_t>((b * T + q.answer_pos) * V)];
        correct += std::max_element(lg, lg + V) - lg == q.answer;
        ++answers;
      }
    }
    for (int64_t l = 0; l < L; ++l) {
      NoiseLayer& nl = r.layers[static_cast<size_t>(l)];
      for (int64_t b = 0; b < B; ++b) {
        const LayerMaps mp = layer_maps(run, l, b, mo);
        const data::RetrievalSample& smp = ss[static_cast<size_t>(b)];
        for (const data::RetrievalQuery& q : smp.queries) {
          const data::RetrievalNeedle& nd = smp.needles[static_cast<size_t>(q.needle)];
          const int64_t a0 = nd.start, a1 = nd.start + spec.needle_len();
          for (int64_t h = 0; h < mp.H; ++h) {
            const size_t row = static_cast<size_t>((h * T + q.answer_pos) * T);
            const int64_t n = q.answer_pos + 1;
            if (mp.has_pair()) {
              accumulate(nl.main, row_noise(&mp.diff[row], n, smp.context, a0, a1));
              accumulate(nl.map1, row_noise(&mp.map1[row], n, smp.context, a0, a1));
              lam_sum[static_cast<size_t>(l)] += mp.lambda[static_cast<size_t>(h * T + q.answer_pos)];
            } else {
              accumulate(nl.main, row_noise(&mp.standard[row], n, smp.context, a0, a1));
            }
          }
          if (l == 0) ++rows;
        }
      }
    }
  }
  // Every layer has the same heads: H rows of weights per answer row.
  const double inv = rows > 0 ? 1.0 / static_cast<double>(rows * cfg.n_heads) : 0.0;
  for (int64_t l = 0; l < L; ++l) {
    NoiseLayer& nl = r.layers[static_cast<size_t>(l)];
    nl.layer = l;
    scale(nl.main, inv);
    scale(nl.map1, inv);
    if (cfg.attention != nn::AttnKind::Standard) nl.lambda = lam_sum[static_cast<size_t>(l)] * inv;
    accumulate(r.mean_main, nl.main);
    accumulate(r.mean_map1, nl.map1);
  }
  scale(r.mean_main, 1.0 / static_cast<double>(L));
  scale(r.mean_map1, 1.0 / static_cast<double>(L));
  r.rows = rows;
  r.accuracy = answers > 0 ? static_cast<double>(correct) / static_cast<double>(answers) : 0.0;
  return r;
}

}  // namespace diffattn::eval
