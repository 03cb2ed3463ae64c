// The evidence layer in C++: the k-way reference against the operator's reference, the
// textbook's exercises, the SNR demonstration's internal consistency, FORMAT.md accounting and
// config parsing, and the explorer's API (every error names its field).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "diffattn/base/files.h"
#include "diffattn/eval/accounting.h"
#include "diffattn/eval/exercises.h"
#include "diffattn/eval/experiment.h"
#include "diffattn/eval/lm_experiment.h"
#include "diffattn/eval/snr.h"
#include "diffattn/explorer/explorer.h"
#include "diffattn/kernels/kway.h"
#include "temp_dir.h"
#include "testing.h"

namespace diffattn {
namespace {

using testing::Problem;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

TEST(KWay, TwoMapsAreDifferentialAttention) {
  for (bool causal : {false, true}) {
    for (kernels::DiffMode mode : {kernels::DiffMode::Signed, kernels::DiffMode::Clamp}) {
      Problem pr;
      pr.B = 2;
      pr.Tq = 5;
      pr.Tk = 9;
      pr.H = 3;
      pr.G = 3;
      pr.D = 7;
      pr.Dv = 5;
      pr.causal = causal;
      pr.mode = mode;
      pr.randomize(11, 0.6f, 0.6f);  // one lambda shared by all pairs
      kernels::AttnParams p = pr.params();
      std::vector<float> want(static_cast<size_t>(pr.B * pr.Tq * pr.H * pr.Dv)), got(want.size());
      p.out = want.data();
      kernels::attention_fwd_ref(p);
      const float coef[2] = {1.0f, -pr.lam[0]};
      kernels::AttnOptions o;
      o.causal = causal;
      o.mode = mode;
      kernels::KWayParams k = kernels::kway_params({pr.q.data(), pr.q_shape()}, {pr.k.data(), pr.k_shape()},
                                 {pr.v.data(), pr.v_shape()}, {coef, {2}}, 2, o);
      k.out = got.data();
      kernels::kway_attention_ref(k);
      EXPECT_LT(max_abs_diff(got, want), 1e-6) << "causal " << causal;
    }
  }
}

TEST(KWay, BadShapesNameTheTensor) {
  std::vector<float> q(1 * 4 * 6 * 2), k(q.size()), v(1 * 4 * 2 * 3), c(3, 1.0f);
  try {
    kernels::kway_params({q.data(), {1, 4, 6, 2}}, {k.data(), {1, 4, 6, 2}}, {v.data(), {1, 4, 3, 3}},
                {c.data(), {3}}, 3, kernels::AttnOptions{});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("v has shape (1, 4, 3, 3), expected (B, Tk, H, Dv) = (1, 4, 2, 3)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(kernels::kway_params({q.data(), {1, 4, 6, 2}}, {k.data(), {1, 4, 6, 2}},
                           {v.data(), {1, 4, 2, 3}}, {c.data(), {2}}, 3, kernels::AttnOptions{}),
               InvalidArgument);
}

TEST(Exercises, GradientOfLambdaAgreesWithFiniteDifferences) {
  const eval::Exercise2 e = eval::exercise2();
  EXPECT_NEAR(e.dlam_signed, e.dlam_signed_fd, 1e-3);
  EXPECT_NEAR(e.dlam_clamp, e.dlam_clamp_fd, 1e-4);
  // -(5 + sum of A2's "mat" column): 4 x 0.1904 + 0.1811 from the textbook's map 2.
  EXPECT_NEAR(e.dlam_signed, -(5 + 4 * 0.1904 + 0.1811), 2e-4);
  EXPECT_LT(e.dlam_signed, 0);
}

TEST(Exercises, ThreeWaySplitAndCausalMask) {
  const eval::Exercise3 e3 = eval::exercise3();
  ASSERT_EQ(e3.splits.size(), 3u);
  EXPECT_EQ(e3.splits[0].zeros_clamp, 2);  // the textbook's two exact zeros
  for (const eval::SplitSummary& s : e3.splits) {
    double lam_sum = 0;
    for (size_t m = 1; m < s.coef.size(); ++m) lam_sum -= s.coef[m];
    EXPECT_NEAR(s.row_sum_signed, 1.0 - lam_sum, 1e-6) << s.name;
    EXPECT_EQ(s.zeros_clamp, s.negatives_signed) << s.name;  // clamping zeroes the negatives
  }
  const eval::Exercise4 e4 = eval::exercise4();
  for (float s : e4.signed_row_sums) EXPECT_NEAR(s, 0.6, 1e-6);
  EXPECT_NEAR(e4.signed_views.diff[0], 0.6, 1e-6);  // "The" sees only itself
  EXPECT_NEAR(e4.clamp_views.diff[0], 1.0, 1e-6);
  EXPECT_GT(e4.max_difference, 0.1);  // masking after the subtraction is another operator
}

TEST(Snr, OperatorOutputIsTheSignalWeightAndLambdaZeroIsStandard) {
  eval::SnrConfig c;
  c.length = 300;
  c.trials = 5;
  c.seed = 9;
  c.lambda = 0.0;
  const eval::SnrTrials t = eval::snr_trials(c);
  for (int b = 0; b < c.trials; ++b) {
    EXPECT_NEAR(t.snr_diff[b], t.snr_standard[b], 1e-5 * t.snr_standard[b]);
    EXPECT_NEAR(t.weight_diff[b], t.weight_standard[b], 1e-6);
  }
  c.lambda = 0.8;
  const eval::SnrResult r = eval::run_snr(c, false);
  EXPECT_EQ(r.example_standard.size(), 300u);
  EXPECT_GT(r.diff.snr, r.standard.snr);  // this construction's common noise partly cancels
  c.length = 1;
  EXPECT_THROW(eval::run_snr(c), InvalidArgument);
}

TEST(Accounting, VersionsCountFormatTensors) {
  model::ModelConfig b = eval::example_7b();
  b.n_kv_heads = 8;
  const eval::Accounting st = eval::account(b, 4096, 2), v1 = eval::account(eval::diff_v1_of(b), 4096, 2),
                   v2 = eval::account(eval::diff_v2_of(b), 4096, 2);
  EXPECT_EQ(v1.params - st.params, b.n_layers * 6 * b.head_dim);
  EXPECT_EQ(v2.params - st.params, b.n_layers * (b.n_heads * b.head_dim * b.d_model + b.n_heads * b.d_model));
  EXPECT_EQ(st.kv_cache_bytes_per_token, v1.kv_cache_bytes_per_token);
  EXPECT_EQ(st.kv_cache_bytes_per_token, v2.kv_cache_bytes_per_token);
  EXPECT_EQ(v1.decode_read_bytes_two_pass, 1.5 * v1.decode_read_bytes_fused);
  model::ModelConfig odd = b;
  odd.n_kv_heads = 1;
  EXPECT_THROW(eval::diff_v1_of(odd), InvalidArgument);
  model::ModelConfig m = b;
  m.ffn_dim = eval::v2_matched_ffn(b);
  EXPECT_LT(std::abs(eval::account(eval::diff_v2_of(m), 1, 2).params - st.params), 3 * b.d_model * b.n_layers);
}

TEST(Accounting, ConfigJsonIsStrict) {
  const std::string ok = R"({"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 256,
    "d_model": 64, "n_layers": 2, "ffn_dim": 128, "max_seq_len": 128, "n_heads": 2,
    "n_kv_heads": 1, "head_dim": 16, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": false})";
  const model::ModelConfig c = model::ModelConfig::from_json(ok, "m/config.json");
  EXPECT_EQ(c.attention, nn::AttnKind::DiffV1);
  EXPECT_EQ(eval::base_of(c).n_heads, 4);
  EXPECT_EQ(eval::base_of(c).n_kv_heads, 2);
  EXPECT_EQ(eval::format_tensors(c).size(), model::tensor_table(c).size());
  auto error_of = [](const std::string& text) {
    try {
      model::ModelConfig::from_json(text, "m/config.json");
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(R"({"format": "diffattn/1", "attention": "standard", "colour": 1})").find("unknown key \"colour\""),
            std::string::npos);
  std::string no_heads = ok;
  no_heads.replace(no_heads.find("\"n_heads\": 2,"), 13, "");
  EXPECT_NE(error_of(no_heads).find("missing key \"n_heads\""), std::string::npos) << error_of(no_heads);
  EXPECT_NE(error_of("[1").find("m/config.json: not valid JSON"), std::string::npos);
}

TEST(Accounting, ReadsHuggingFaceConfigs) {
  // A DiffLlama config.json reads as the diff_v1 model it loads as: 8 query heads of 16 are
  // 4 pairs, 4 key/value heads 2 groups; its base is the standard model of 8 heads.
  const std::string dir = ::testing::TempDir() + "/hf_accounting";
  make_dirs(dir);
  write_file_atomic(dir + "/config.json", R"({"model_type": "diffllama", "vocab_size": 300,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 4, "tie_word_embeddings": true})");
  const model::ModelConfig c = eval::read_model_config(dir);
  EXPECT_EQ(c.attention, nn::AttnKind::DiffV1);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(eval::base_of(c).n_heads, 8);
  EXPECT_EQ(eval::account(c, 16, 2).params, model::count_params(c));
}

TEST(ExplorerApi, ComputesTheViewsAndNamesBadFields) {
  using nlohmann::json;
  const explorer::Response r = explorer::handle("POST", "/api/views", R"({"lambda": 0.4, "mode": "clamp"})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_NEAR(j["views"]["diff"][1][2].get<double>(), 0.5052, 5e-5);
  EXPECT_EQ(j["views"]["diff"][1][3].get<double>(), 0.0);
  EXPECT_EQ(j["tokens"][1], "cat");
  const struct {
    const char* body;
    int status;
    const char* needle;
  } bad[] = {
      {R"({"lambda": null})", 400, "\"lambda\" must be a number"},
      {R"({"lambda": 5})", 400, "\"lambda\" must be between"},
      {R"({"mode": 3})", 400, "\"mode\""},
      {R"({"source": "random", "length": 0})", 400, "\"length\""},
      {R"({"source": "random", "head_dim": 1000})", 400, "\"head_dim\""},
      {R"({"seed": 1})", 400, "\"seed\" applies to source \"random\" only"},
      {R"({"x": 1})", 400, "unknown field \"x\""},
      {R"("text")", 400, "JSON object"},
      {R"({)", 400, "not valid JSON"},
  };
  for (const auto& b : bad) {
    const explorer::Response e = explorer::handle("POST", "/api/views", b.body);
    EXPECT_EQ(e.status, b.status) << b.body;
    EXPECT_NE(json::parse(e.body)["error"].get<std::string>().find(b.needle), std::string::npos)
        << b.body << " -> " << e.body;
  }
  EXPECT_EQ(explorer::handle("POST", "/api/views", std::string(explorer::kMaxBodyBytes + 1, ' ')).status, 413);
  EXPECT_EQ(explorer::handle("GET", "/api/views", "").status, 405);
  EXPECT_EQ(explorer::handle("GET", "/nothing", "").status, 404);
  const explorer::Response page = explorer::handle("GET", "/", "");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("<canvas id=\"view-diff\""), std::string::npos);
  EXPECT_EQ(explorer::handle("GET", "/app.js", "").content_type, "text/javascript; charset=utf-8");
}

}  // namespace
}  // namespace diffattn

namespace {

// A stand-in corpus in scripts/corpus.py's format: sentences of a few words, 12 + 4 documents.
void write_fake_corpus(const std::string& dir) {
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "python"};
  uint64_t s = 7;
  for (auto [name, n] : {std::pair<std::string, int>{"train.jsonl", 12}, {"heldout.jsonl", 4}}) {
    std::string out;
    for (int d = 0; d < n; ++d) {
      std::string text;
      for (int w = 0; w < 30 + 7 * d; ++w) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        text += std::string(words[(s >> 33) % 11]) + " ";
      }
      out += nlohmann::json({{"source", "fake"}, {"id", name + std::to_string(d)}, {"text", text}}).dump() + "\n";
    }
    diffattn::write_file_atomic(dir + "/" + name, out);
  }
}

diffattn::eval::LmExperimentOptions tiny_lm(const std::string& corpus) {
  diffattn::eval::LmExperimentOptions o;
  o.corpus_dir = corpus;
  o.size.d_model = 16;
  o.size.n_layers = 2;
  o.size.n_heads = 2;
  o.size.ffn_dim = 40;
  o.train.steps = 3;
  o.train.batch = 2;
  o.train.seq_len = 16;
  o.train.adamw.warmup = 1;
  o.eval_windows = 2;
  return o;
}

}  // namespace

TEST(LmExperiment, PairedInitSharesEveryCommonTensor) {
  using diffattn::nn::AttnKind;
  diffattn::model::ModelConfig size;
  size.d_model = 16;
  size.n_layers = 2;
  size.n_heads = 2;
  size.ffn_dim = 40;
  size.max_seq_len = 16;
  std::vector<diffattn::model::Model> ms;
  for (AttnKind k : {AttnKind::DiffV1, AttnKind::DiffV2, AttnKind::Standard}) {
    ms.emplace_back(diffattn::eval::version_of_size(size, k));
    diffattn::eval::paired_init(ms.back(), 5);
  }
  std::vector<const diffattn::model::Model*> p{&ms[0], &ms[1], &ms[2]};
  const int64_t shared = diffattn::eval::check_pairing(p);
  EXPECT_GE(shared, 2 * 9 + 2);  // per layer: norms, k/v/out, V1 and standard's q and SwiGLU; embed, norm
  EXPECT_EQ(ms[0].weight_f32("layers.1.attn.q_proj.weight"), ms[2].weight_f32("layers.1.attn.q_proj.weight"));
  EXPECT_EQ(ms[1].weight_f32("embed_tokens.weight"), ms[2].weight_f32("embed_tokens.weight"));
  const std::vector<float> norm = ms[1].weight_f32("layers.0.attn_norm.weight");
  EXPECT_EQ(norm, std::vector<float>(norm.size(), 1.0f));
  diffattn::model::Model other(diffattn::eval::version_of_size(size, AttnKind::Standard));
  diffattn::eval::paired_init(other, 6);
  EXPECT_NE(other.weight_f32("embed_tokens.weight"), ms[2].weight_f32("embed_tokens.weight"));
  ms[1].params()[static_cast<size_t>(ms[1].tensor("layers.0.attn.k_proj.weight").offset)] += 1e-6f;
  EXPECT_THROW(
      {
        try {
          diffattn::eval::check_pairing(p);
        } catch (const diffattn::InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("k_proj"), std::string::npos);
          throw;
        }
      },
      diffattn::InvalidArgument);
}

TEST(LmExperiment, IntervalsAndBuckets) {
  const diffattn::eval::Interval c = diffattn::eval::t_interval({1.0, 2.0, 3.0});
  EXPECT_DOUBLE_EQ(c.mean, 2.0);
  EXPECT_NEAR(c.lo, 2.0 - 4.303 / std::sqrt(3.0), 1e-12);
  EXPECT_TRUE(std::isnan(diffattn::eval::t_interval({1.0}).lo));
  EXPECT_NEAR(diffattn::eval::t975(1000), 1.962, 1e-3);
  using B = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(diffattn::eval::position_buckets(1024), (B{{0, 8}, {8, 64}, {64, 256}, {256, 1024}}));
  EXPECT_EQ(diffattn::eval::position_buckets(16), (B{{0, 8}, {8, 16}}));
}

TEST(LmExperiment, TinyRunEndToEndIsPairedSeededAndReported) {
  diffattn::testing::TempDir dir("lm_experiment");
  write_fake_corpus(dir.str());
  const diffattn::eval::LmExperimentOptions o = tiny_lm(dir.str());
  const diffattn::eval::LmExperimentResult r = diffattn::eval::run_lm_experiment(o);
  ASSERT_EQ(r.seeds.size(), 3u);
  EXPECT_GT(r.shared_tensors, 0);
  EXPECT_EQ(r.buckets.size(), 2u);
  for (const diffattn::eval::LmSeedResult& s : r.seeds) {
    ASSERT_EQ(s.models.size(), 3u);
    for (const diffattn::eval::LmModelResult& m : s.models) {
      EXPECT_EQ(m.loss_curve.size(), 3u);
      EXPECT_EQ(m.doc_loss.size(), 4u);
      EXPECT_TRUE(std::isfinite(m.loss_doc_mean));
      EXPECT_EQ(m.lambdas.size(), m.kind == diffattn::nn::AttnKind::Standard ? 0u : 2u);
    }
  }
  ASSERT_EQ(r.paired.size(), 3u);
  EXPECT_EQ(r.paired[0].b, diffattn::nn::AttnKind::DiffV2);  // V1 - V2, then both against standard
  EXPECT_EQ(r.paired[1].b, diffattn::nn::AttnKind::Standard);
  for (const diffattn::eval::LmPaired& p : r.paired) {
    for (const diffattn::eval::Interval& c : p.per_seed) EXPECT_TRUE(c.lo <= c.mean && c.mean <= c.hi);
    EXPECT_TRUE(p.pooled.lo <= p.pooled.mean && p.pooled.mean <= p.pooled.hi);
    EXPECT_EQ(p.by_bucket.size(), 2u);
  }
  // seeded: seed 2 alone trains to the same losses as in the three-seed run
  diffattn::eval::LmExperimentOptions o2 = o;
  o2.seeds = {2};
  const diffattn::eval::LmExperimentResult r2 = diffattn::eval::run_lm_experiment(o2);
  EXPECT_EQ(r2.seeds[0].models[0].loss_curve, r.seeds[1].models[0].loss_curve);
  EXPECT_EQ(r2.seeds[0].models[2].doc_loss, r.seeds[1].models[2].doc_loss);
  const std::vector<std::string> files = diffattn::eval::write_lm_report(r, dir / "report");
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(diffattn::read_file(files[2]).substr(1, 3), "PNG");
  const std::string md = diffattn::read_file(files[0]);
  for (const char* h : {"## Scale and budget", "## Paired differences", "## Loss by position bucket", "## Lambda per layer",
                        "do not show"}) {
    EXPECT_NE(md.find(h), std::string::npos) << h;
  }
  const nlohmann::json j = nlohmann::json::parse(diffattn::read_file(files[1]));
  EXPECT_EQ(j["seeds"].size(), 3u);
  EXPECT_EQ(j["paired"].size(), 3u);
}

TEST(LmExperiment, CorpusErrorsNameTheFile) {
  diffattn::testing::TempDir dir("lm_corpus");
  EXPECT_THROW(diffattn::eval::read_lm_corpus(dir / "none"), diffattn::IoError);
  diffattn::write_file_atomic(dir / "train.jsonl", "{\"source\": \"a\"}\n");
  diffattn::write_file_atomic(dir / "heldout.jsonl", "");
  try {
    diffattn::eval::read_lm_corpus(dir.str());
    FAIL() << "no error";
  } catch (const diffattn::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("train.jsonl line 1"), std::string::npos) << e.what();
  }
}

TEST(RetrievalSeeds, WilsonIntervalAndSummary) {
  const auto [lo, hi] = diffattn::eval::wilson_interval(5, 10);
  EXPECT_NEAR(lo, 0.2366, 1e-4);
  EXPECT_NEAR(hi, 0.7634, 1e-4);
  EXPECT_DOUBLE_EQ(diffattn::eval::wilson_interval(0, 10).first, 0.0);
  diffattn::eval::RetrievalExperimentOptions o;
  o.task.context = 32;
  o.task.min_context = 0;
  o.lengths = {32};
  o.depths = {0.5};
  o.eval_samples = 4;
  o.noise_samples = 2;
  o.train.steps = 2;
  o.train.batch = 2;
  o.paired_init = true;
  std::vector<diffattn::eval::RetrievalExperimentResult> runs;
  for (uint64_t seed : {1u, 2u}) {
    o.task.seed = seed;
    runs.push_back(diffattn::eval::run_retrieval_experiment(o));
  }
  diffattn::testing::TempDir dir("retrieval_seeds");
  const std::vector<std::string> files = diffattn::eval::write_retrieval_seed_summary(runs, dir.str());
  ASSERT_EQ(files.size(), 2u);
  const nlohmann::json j = nlohmann::json::parse(diffattn::read_file(files[1]));
  EXPECT_DOUBLE_EQ(j["chance"].get<double>(), 1.0 / static_cast<double>(o.task.needles));
  const nlohmann::json& a = j["accuracy"]["diff_v1"]["32"];
  ASSERT_EQ(a["per_seed"].size(), 2u);
  const double m = (runs[0].models[0].acc_by_length[0] + runs[1].models[0].acc_by_length[0]) / 2;
  EXPECT_DOUBLE_EQ(a["mean"].get<double>(), m);
  EXPECT_EQ(j["paired"].size(), 3u);  // V1 - V2, V1 - standard, V2 - standard
  EXPECT_NE(diffattn::read_file(files[0]).find("against chance"), std::string::npos);
}
