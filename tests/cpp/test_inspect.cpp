// Looking inside trained models: the multi-needle retrieval generator (determinism, structure,
// near-miss keys, the answer-only targets), the attention-noise shares on hand-made rows, and
// the maps recomputed from the saved lse against a dense softmax of the same q and k.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "diffattn/data/retrieval.h"
#include "diffattn/eval/experiment.h"
#include "diffattn/eval/inspect.h"
#include "diffattn/model/train_context.h"

namespace diffattn {
namespace {

data::RetrievalSpec small_spec() {
  data::RetrievalSpec s;
  s.context = 48;
  s.needles = 5;
  s.queries = 2;
  s.key_len = 2;
  s.key_symbols = 6;
  s.seed = 7;
  return s;
}

int differing(const std::string& a, const std::string& b) {
  int d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
  return d;
}

TEST(Retrieval, SamplesAreAPureFunctionOfSpecAndIndex) {
  const data::RetrievalSpec s = small_spec();
  const auto a = data::make_retrieval_sample(s, 3), b = data::make_retrieval_sample(s, 3);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(a.tokens, data::make_retrieval_sample(s, 4).tokens);
  data::RetrievalSpec other = s;
  other.seed = 8;
  EXPECT_NE(a.tokens, data::make_retrieval_sample(other, 3).tokens);
}

TEST(Retrieval, StructureNearMissesAndAnswerMask) {
  const data::RetrievalSpec s = small_spec();
  for (uint64_t idx = 0; idx < 200; ++idx) {
    const data::RetrievalSample x = data::make_retrieval_sample(s, idx);
    const std::string text = x.text();
    ASSERT_EQ(static_cast<int64_t>(x.tokens.size()), s.context + s.queries * s.query_len());
    ASSERT_EQ(x.needles.size(), 5u);
    std::set<std::string> keys;
    int queried = 0, near = 0;
    for (size_t i = 0; i < x.needles.size(); ++i) {
      const data::RetrievalNeedle& n = x.needles[i];
      if (i > 0) EXPECT_GE(n.start, x.needles[i - 1].start + s.needle_len());  // no overlap
      EXPECT_EQ(text.substr(static_cast<size_t>(n.start), static_cast<size_t>(s.needle_len())),
                "#" + n.key + static_cast<char>(n.value + '0'));
      keys.insert(n.key);
      queried += n.queried;
      if (n.near_miss_of >= 0) {
        const data::RetrievalNeedle& twin = x.needles[static_cast<size_t>(n.near_miss_of)];
        EXPECT_TRUE(twin.queried);
        EXPECT_EQ(differing(n.key, twin.key), 1) << n.key << " vs " << twin.key;
        ++near;
      }
      for (const data::RetrievalNeedle& q : x.needles) {  // no needle answers a query it nearly matches
        if (!n.queried && q.queried && differing(n.key, q.key) == 1) EXPECT_NE(n.value, q.value) << text;
      }
    }
    EXPECT_EQ(keys.size(), 5u) << "keys must be distinct: " << text;
    EXPECT_EQ(queried, 2);
    EXPECT_EQ(near, 3) << "near_misses = -1: every unqueried needle is a near miss";
    // Filler is lowercase; '#' only at needle starts.
    int hashes = 0;
    for (int64_t t = 0; t < s.context; ++t) hashes += text[static_cast<size_t>(t)] == '#';
    EXPECT_EQ(hashes, 5);
    // Targets: exactly the queries' answers, at the key's last symbol, and -1 elsewhere.
    int64_t scored = 0;
    for (size_t t = 0; t < x.targets.size(); ++t) scored += x.targets[t] >= 0;
    EXPECT_EQ(scored, 2);
    for (size_t q = 0; q < x.queries.size(); ++q) {
      const data::RetrievalQuery& rq = x.queries[q];
      const data::RetrievalNeedle& n = x.needles[static_cast<size_t>(rq.needle)];
      const int64_t at = s.context + static_cast<int64_t>(q) * s.query_len();
      EXPECT_EQ(text.substr(static_cast<size_t>(at), static_cast<size_t>(s.query_len())),
                "?" + n.key + static_cast<char>(n.value + '0'));
      EXPECT_EQ(rq.answer_pos, at + s.key_len);
      EXPECT_EQ(x.targets[static_cast<size_t>(rq.answer_pos)], rq.answer);
      EXPECT_EQ(x.tokens[static_cast<size_t>(rq.answer_pos + 1)], rq.answer);  // the next token
    }
  }
}

TEST(Retrieval, DepthPlacesTheFirstQueriedNeedle) {
  data::RetrievalSpec s = small_spec();
  for (double d : {0.0, 0.5, 1.0}) {
    s.depth = d;
    const data::RetrievalSample x = data::make_retrieval_sample(s, 11);
    const data::RetrievalNeedle& n = x.needles[static_cast<size_t>(x.queries[0].needle)];
    EXPECT_EQ(n.start, std::llround(d * static_cast<double>(s.context - s.needle_len())));
    EXPECT_DOUBLE_EQ(n.depth, d);
  }
}

TEST(Retrieval, BadSpecsNameTheField) {
  auto msg = [](data::RetrievalSpec s) {
    try {
      s.validate();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  data::RetrievalSpec s = small_spec();
  s.queries = 6;
  EXPECT_NE(msg(s).find("queries"), std::string::npos);
  s = small_spec();
  s.context = 20;
  EXPECT_NE(msg(s).find("context"), std::string::npos);
  s = small_spec();
  s.key_symbols = 27;
  EXPECT_NE(msg(s).find("key_symbols"), std::string::npos);
  EXPECT_THROW(data::RetrievalSpec::from_json("{\"needles\": 3, \"colour\": 1}", "x.json"), InvalidArgument);
  const data::RetrievalSpec back = data::RetrievalSpec::from_json(small_spec().to_json(), "x.json");
  EXPECT_EQ(back.to_json(), small_spec().to_json());
}

TEST(Retrieval, TaskBatchesPadOnTheRightWithUnscoredTargets) {
  data::RetrievalSpec s = small_spec();
  s.min_context = 40;
  const data::RetrievalTask task(s);
  const int64_t B = 4, T = task.max_len() + 3;
  std::vector<int32_t> tok(static_cast<size_t>(B * T)), tgt(static_cast<size_t>(B * T));
  task.batch(2, B, T, tok.data(), tgt.data());
  for (int64_t b = 0; b < B; ++b) {
    const data::RetrievalSample x = data::make_retrieval_sample(s, static_cast<uint64_t>(2 * B + b));
    EXPECT_GE(x.context, 40);
    const int64_t n = static_cast<int64_t>(x.tokens.size());
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(tok[static_cast<size_t>(b * T + t)], t < n ? x.tokens[static_cast<size_t>(t)] : data::kRetrievalPad);
      EXPECT_EQ(tgt[static_cast<size_t>(b * T + t)], t < n ? x.targets[static_cast<size_t>(t)] : -1);
    }
  }
  EXPECT_THROW(task.batch(0, 1, task.max_len() - 1, tok.data(), tgt.data()), InvalidArgument);
}

TEST(Noise, SharesOfHandMadeRows) {
  // Softmax row over 5 keys: context = keys 0..2, answer span = key 1, keys 3..4 the query's own.
  const float w[5] = {0.1f, 0.2f, 0.3f, 0.25f, 0.15f};
  eval::NoiseStats s = eval::row_noise(w, 5, 3, 1, 2);
  EXPECT_NEAR(s.answer, 0.2, 1e-7);
  EXPECT_NEAR(s.noise, 0.4, 1e-7);
  EXPECT_NEAR(s.noise_abs, 0.4, 1e-7);
  // A signed differential row: negative noise cancels positive noise; |w| does not.
  const float d[4] = {-0.1f, 0.5f, 0.2f, 0.4f};
  s = eval::row_noise(d, 4, 3, 1, 2);
  EXPECT_NEAR(s.answer, 0.5 / 1.2, 1e-7);
  EXPECT_NEAR(s.noise, 0.1 / 1.2, 1e-7);
  EXPECT_NEAR(s.noise_abs, 0.3 / 1.2, 1e-7);
}

model::ModelConfig tiny(nn::AttnKind kind) {
  model::ModelConfig z;
  z.d_model = 32;
  z.n_layers = 2;
  z.n_heads = 4;
  z.ffn_dim = 48;
  z.max_seq_len = 64;
  return eval::version_of_size(z, kind, 128);
}

// Dense softmax of map m of pair/head h, row i, from the views layer_attention gives, in double.
std::vector<double> dense_row(const kernels::AttnProblem& p, int64_t h, int m, int64_t i) {
  const int64_t qh = p.maps == 2 ? 2 * h + m : h;
  const int64_t g = h / (p.H / p.G);
  const int64_t kh = (p.maps == 2 && !p.shared_keys) ? 2 * g + m : g;
  std::vector<double> s(static_cast<size_t>(i + 1));
  double mx = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < p.D; ++d) {
      dot += static_cast<double>(p.q[i * p.q_row_stride + qh * p.D + d]) * p.kf()[j * p.k_row_stride + kh * p.D + d];
    }
    s[static_cast<size_t>(j)] = dot * p.scale;
    mx = std::max(mx, s[static_cast<size_t>(j)]);
  }
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  for (double& x : s) x /= sum;
  return s;
}

class MapsOfKind : public ::testing::TestWithParam<nn::AttnKind> {};

TEST_P(MapsOfKind, AgreeWithADenseRecomputationAndTheOutput) {
  model::Model m(tiny(GetParam()));
  m.init_weights(3);
  model::TrainContext run(m);
  EXPECT_THROW(run.layer_attention(0), InvalidArgument);  // no forward yet
  const int64_t B = 2, T = 20;
  std::mt19937 rng(5);
  std::vector<int32_t> tok(static_cast<size_t>(B * T));
  for (int32_t& t : tok) t = static_cast<int32_t>(rng() % 128);
  run.forward(tok.data(), nullptr, B, T);
  for (int64_t l = 0; l < 2; ++l) {
    const int64_t b = 1;
    const eval::LayerMaps mp = eval::layer_maps(run, l, b);
    kernels::AttnBwdParams p = run.layer_attention(l).params;
    p.q += b * p.q_batch_stride;
    p.k = p.kf() + b * p.k_batch_stride;
    p.v = p.vf() + b * p.v_batch_stride;
    p.out += b * p.o_batch_stride;
    for (int64_t h = 0; h < mp.H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const size_t row = static_cast<size_t>((h * T + i) * T);
        const std::vector<double> a1 = dense_row(p, h, 0, i);
        const std::vector<double> a2 = p.maps == 2 ? dense_row(p, h, 1, i) : a1;
        const double lam = p.maps == 2 ? (p.lam_per_token ? p.lam[(b * T + i) * p.H + h] : p.lam[h]) : 0.0;
        const std::vector<float>& main = mp.has_pair() ? mp.diff : mp.standard;
        for (int64_t j = 0; j < T; ++j) {
          const double w1 = j <= i ? a1[static_cast<size_t>(j)] : 0.0, w2 = j <= i ? a2[static_cast<size_t>(j)] : 0.0;
          if (mp.has_pair()) {
            ASSERT_NEAR(mp.map1[row + j], w1, 2e-6) << "layer " << l << " pair " << h << " row " << i;
            ASSERT_NEAR(mp.map2[row + j], w2, 2e-6);
            ASSERT_NEAR(mp.diff[row + j], w1 - lam * w2, 4e-6);
          } else {
            ASSERT_NEAR(mp.standard[row + j], w1, 2e-6);
          }
        }
        // The map reproduces the operator's saved output: out_i = sum_j w_ij v_j.
        const int64_t g = h / (p.H / p.G);
        for (int64_t d = 0; d < p.Dv; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += static_cast<double>(main[row + j]) * p.vf()[j * p.v_row_stride + g * p.Dv + d];
          ASSERT_NEAR(p.out[i * p.o_row_stride + h * p.Dv + d], o, 2e-5);
        }
        if (mp.has_pair()) {
          // The standard view: one softmax over the pair's full width, 1/sqrt(2D).
          double mx = -INFINITY, sum = 0;
          std::vector<double> s(static_cast<size_t>(i + 1));
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int mm = 0; mm < 2; ++mm) {
              const int64_t kh = p.shared_keys ? g : 2 * g + mm;
              for (int64_t d = 0; d < p.D; ++d) {
                dot += static_cast<double>(p.q[i * p.q_row_stride + (2 * h + mm) * p.D + d]) * p.kf()[j * p.k_row_stride + kh * p.D + d];
              }
            }
            s[static_cast<size_t>(j)] = dot / std::sqrt(2.0 * static_cast<double>(p.D));
            mx = std::max(mx, s[static_cast<size_t>(j)]);
          }
          for (double& x : s) sum += (x = std::exp(x - mx));
          for (int64_t j = 0; j <= i; ++j) ASSERT_NEAR(mp.standard[row + j], s[static_cast<size_t>(j)] / sum, 2e-6);
        }
      }
    }
  }
  // A lambda given replaces the learned one in the differential map only.
  if (GetParam() != nn::AttnKind::Standard) {
    eval::MapOptions o;
    o.lambda = 0.25;
    const eval::LayerMaps a = eval::layer_maps(run, 1, 0), g = eval::layer_maps(run, 1, 0, o);
    EXPECT_EQ(a.map1, g.map1);
    for (size_t k = 0; k < g.diff.size(); ++k) ASSERT_NEAR(g.diff[k], g.map1[k] - 0.25f * g.map2[k], 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, MapsOfKind,
                         ::testing::Values(nn::AttnKind::DiffV1, nn::AttnKind::DiffV2, nn::AttnKind::Standard),
                         [](const auto& info) { return std::string(nn::attn_kind_name(info.param)); });

TEST(Noise, AnalysisOfAnUntrainedModelIsConsistent) {
  data::RetrievalSpec s = small_spec();
  for (nn::AttnKind kind : {nn::AttnKind::Standard, nn::AttnKind::DiffV1}) {
    model::Model m(tiny(kind));
    m.init_weights(1);
    model::TrainContext run(m);
    const eval::NoiseAnalysis r = eval::analyze_noise(run, s, 6, 4);
    EXPECT_EQ(r.samples, 6);
    EXPECT_EQ(r.rows, 12);
    ASSERT_EQ(r.layers.size(), 2u);
    for (const eval::NoiseLayer& l : r.layers) {
      EXPECT_GT(l.main.answer, 0.0);
      EXPECT_GE(l.main.noise_abs + 1e-12, std::abs(l.main.noise));
      EXPECT_LE(l.main.answer + l.main.noise_abs, 1.0 + 1e-9);
      if (kind == nn::AttnKind::Standard) {
        EXPECT_TRUE(std::isnan(l.lambda));
        // Softmax rows: no cancellation, so signed and absolute noise agree; an untrained model
        // spreads its weight, so most of it is on the 48-token context.
        EXPECT_NEAR(l.main.noise, l.main.noise_abs, 1e-12);
        EXPECT_GT(l.main.noise, 0.5);
      } else {
        EXPECT_NEAR(l.lambda, m.layer_lambdas()[static_cast<size_t>(l.layer)], 1e-6);
      }
    }
    EXPECT_GE(r.accuracy, 0.0);
    EXPECT_LE(r.accuracy, 1.0);
  }
}

}  // namespace
}  // namespace diffattn
