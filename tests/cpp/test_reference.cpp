// The reference operator against the textbook's worked numbers, finite differences, numerical
// edge cases and bad input. (Its agreement with an independent PyTorch formulation over every
// mode and layout is in tests/python/test_operator_torch.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "diffattn/eval/textbook.h"
#include "diffattn/kernels/attention.h"
#include "testing.h"

namespace diffattn {
namespace {

using testing::Problem;

constexpr int T = eval::textbook::kTokens;

// The textbook's numbers (Chapter 14.15, include/diffattn/eval/textbook.h), 4 decimals.
constexpr float kA1[T][T] = {{0.1237f, 0.2509f, 0.2509f, 0.1237f, 0.2509f},
                             {0.3664f, 0.0891f, 0.3664f, 0.0891f, 0.0891f},
                             {0.1811f, 0.1811f, 0.3673f, 0.0893f, 0.1811f},
                             {0.2000f, 0.2000f, 0.2000f, 0.2000f, 0.2000f},
                             {0.1237f, 0.2509f, 0.2509f, 0.1237f, 0.2509f}};
constexpr float kA2[T][T] = {{0.1337f, 0.2711f, 0.1337f, 0.2711f, 0.1904f},
                             {0.2711f, 0.1337f, 0.1337f, 0.2711f, 0.1904f},
                             {0.1337f, 0.2711f, 0.1337f, 0.2711f, 0.1904f},
                             {0.1811f, 0.1811f, 0.0893f, 0.3673f, 0.1811f},
                             {0.2711f, 0.1337f, 0.1337f, 0.2711f, 0.1904f}};
constexpr float kDiff[T][T] = {{0.0702f, 0.1424f, 0.1974f, 0.0152f, 0.1747f},
                               {0.2579f, 0.0356f, 0.3129f, -0.0194f, 0.0129f},
                               {0.1276f, 0.0727f, 0.3139f, -0.0191f, 0.1050f},
                               {0.1276f, 0.1276f, 0.1643f, 0.0531f, 0.1276f},
                               {0.0152f, 0.1974f, 0.1974f, 0.0152f, 0.1747f}};
constexpr float kRowSums[T] = {0.6000f, 0.6194f, 0.6191f, 0.6000f, 0.6000f};
constexpr float kADiff[T][T] = {{0.1170f, 0.2374f, 0.3290f, 0.0254f, 0.2912f},
                                {0.4164f, 0.0575f, 0.5052f, 0.0000f, 0.0209f},
                                {0.2062f, 0.1174f, 0.5069f, 0.0000f, 0.1695f},
                                {0.2126f, 0.2126f, 0.2738f, 0.0884f, 0.2126f},
                                {0.0254f, 0.3290f, 0.3290f, 0.0254f, 0.2912f}};
constexpr float kOutClamp[T][4] = {{0.2626f, 0.3830f, 0.4746f, 0.1710f},
                                   {0.4269f, 0.0679f, 0.5156f, 0.0104f},
                                   {0.2909f, 0.2021f, 0.5917f, 0.0848f},
                                   {0.3189f, 0.3189f, 0.3801f, 0.1947f},
                                   {0.1710f, 0.4746f, 0.4746f, 0.1710f}};
constexpr float kStdWeights[T][T] = {{0.1095f, 0.2976f, 0.1805f, 0.1805f, 0.2318f},
                                     {0.4026f, 0.0898f, 0.2442f, 0.1481f, 0.1153f},
                                     {0.1519f, 0.2505f, 0.2505f, 0.1519f, 0.1951f},
                                     {0.1903f, 0.1903f, 0.1154f, 0.3137f, 0.1903f},
                                     {0.1892f, 0.1892f, 0.1892f, 0.1892f, 0.2430f}};
constexpr float kOutStd[T][4] = {{0.2254f, 0.4135f, 0.2964f, 0.2964f},
                                 {0.4602f, 0.1475f, 0.3018f, 0.2058f},
                                 {0.2495f, 0.3481f, 0.3481f, 0.2495f},
                                 {0.2854f, 0.2854f, 0.2106f, 0.4089f},
                                 {0.3108f, 0.3108f, 0.3108f, 0.3108f}};

// Half a unit in the 4th decimal, plus float rounding.
constexpr float kTol4 = 0.5e-4f + 1e-6f;

Problem textbook_problem(kernels::DiffMode mode, float lam = eval::textbook::kLambda) {
  Problem pr;
  pr.B = 1;
  pr.Tq = pr.Tk = T;
  pr.H = pr.G = 1;
  pr.D = 2;
  pr.Dv = 4;
  pr.mode = mode;
  pr.q.assign(eval::textbook::kQ.begin(), eval::textbook::kQ.end());
  pr.k.assign(eval::textbook::kK.begin(), eval::textbook::kK.end());
  pr.v.assign(eval::textbook::kV.begin(), eval::textbook::kV.end());
  pr.lam = {lam};
  return pr;
}

std::vector<float> probs(const Problem& pr, const testing::FwdResult& f, int map) {
  const kernels::AttnParams p = pr.params();
  std::vector<float> a(static_cast<size_t>(p.B * p.H * p.Tq * p.Tk));
  kernels::attention_probs(p, f.lse.data(), map, a.data());
  return a;
}

TEST(Textbook, ClampModeReproducesEveryStep) {
  const Problem pr = textbook_problem(kernels::DiffMode::Clamp);
  const testing::FwdResult f = testing::run_fwd(pr);
  const std::vector<float> a1 = probs(pr, f, 0), a2 = probs(pr, f, 1);
  for (int i = 0; i < T; ++i) {
    std::vector<float> d(T), w(T);
    kernels::diff_row_weights(&a1[i * T], &a2[i * T], eval::textbook::kLambda, kernels::DiffMode::Signed, T, d.data());
    kernels::diff_row_weights(&a1[i * T], &a2[i * T], eval::textbook::kLambda, kernels::DiffMode::Clamp, T, w.data());
    float row_sum = 0;
    for (int j = 0; j < T; ++j) {
      SCOPED_TRACE("row " + std::to_string(i) + " col " + std::to_string(j));
      EXPECT_NEAR(a1[i * T + j], kA1[i][j], kTol4);
      EXPECT_NEAR(a2[i * T + j], kA2[i][j], kTol4);
      EXPECT_NEAR(d[j], kDiff[i][j], 1e-4f);  // the book subtracts rounded maps
      EXPECT_NEAR(w[j], kADiff[i][j], kTol4);
      row_sum += std::max(d[j], 0.0f);
    }
    EXPECT_NEAR(row_sum, kRowSums[i], 1e-4f);
    for (int c = 0; c < 4; ++c) EXPECT_NEAR(f.out[i * 4 + c], kOutClamp[i][c], kTol4);
  }
  // The two exact zeros of the book: cat->on and sat->on.
  std::vector<float> w(T);
  kernels::diff_row_weights(&a1[1 * T], &a2[1 * T], eval::textbook::kLambda, kernels::DiffMode::Clamp, T, w.data());
  EXPECT_EQ(w[3], 0.0f);
  kernels::diff_row_weights(&a1[2 * T], &a2[2 * T], eval::textbook::kLambda, kernels::DiffMode::Clamp, T, w.data());
  EXPECT_EQ(w[3], 0.0f);
}

TEST(Textbook, SignedModeIsTheBooksDifferentialMapTimesV) {
  const Problem pr = textbook_problem(kernels::DiffMode::Signed);
  const testing::FwdResult f = testing::run_fwd(pr);
  for (int i = 0; i < T; ++i) {
    for (int c = 0; c < 4; ++c) {
      // (A1 - 0.4 A2) V from the book's rounded D matrix.
      double expect = 0;
      for (int j = 0; j < T; ++j) expect += kDiff[i][j] * eval::textbook::kV[j * 4 + c];
      EXPECT_NEAR(f.out[i * 4 + c], expect, 3e-4) << "row " << i << " col " << c;
      // and, exactly, out = A1 V - lam A2 V with A2 V saved as o2
      double a2v = 0;
      for (int j = 0; j < T; ++j) a2v += kA2[i][j] * eval::textbook::kV[j * 4 + c];
      EXPECT_NEAR(f.o2[i * 4 + c], a2v, 3e-4);
    }
  }
}

TEST(Textbook, StandardAttentionMatchesChapterOne) {
  Problem pr;
  pr.maps = 1;
  pr.B = 1;
  pr.Tq = pr.Tk = T;
  pr.H = pr.G = 1;
  pr.D = pr.Dv = 4;
  pr.q.assign(eval::textbook::kQ.begin(), eval::textbook::kQ.end());
  pr.k.assign(eval::textbook::kK.begin(), eval::textbook::kK.end());
  pr.v.assign(eval::textbook::kV.begin(), eval::textbook::kV.end());
  const testing::FwdResult f = testing::run_fwd(pr);
  const std::vector<float> a = probs(pr, f, 0);
  for (int i = 0; i < T; ++i) {
    for (int j = 0; j < T; ++j) EXPECT_NEAR(a[i * T + j], kStdWeights[i][j], kTol4);
    for (int c = 0; c < 4; ++c) EXPECT_NEAR(f.out[i * 4 + c], kOutStd[i][c], kTol4);
  }
}

// ---- gradients by central differences ----

struct GradCase {
  const char* name;
  int maps;
  int64_t B, Tq, Tk, H, G, D, Dv;
  bool shared_keys, lam_per_token, causal;
  float lam_lo, lam_hi;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class FiniteDifferences : public ::testing::TestWithParam<GradCase> {};

// L = sum(out * R): its gradient is the backward with dout = R.
double loss(const Problem& pr, const std::vector<float>& R) {
  const testing::FwdResult f = testing::run_fwd(pr);
  double s = 0;
  for (size_t i = 0; i < R.size(); ++i) s += static_cast<double>(f.out[i]) * R[i];
  return s;
}

void check_tensor(const char* name, Problem& pr, std::vector<float>& x,
                  const std::vector<float>& grad, const std::vector<float>& R) {
  // Every entry of small tensors; central differences with h = 1e-2 (float forward, double
  // accumulation: rounding noise ~1e-7 / h, truncation ~h^2).
  const float h = 1e-2f;
  double max_grad = 1e-3;
  for (float g : grad) max_grad = std::max(max_grad, std::abs(static_cast<double>(g)));
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(pr, R);
    x[i] = x0 - h;
    const double lm = loss(pr, R);
    x[i] = x0;
    const double fd = (lp - lm) / (2.0 * h);
    EXPECT_NEAR(grad[i], fd, 2e-3 * max_grad + 2e-3 * std::abs(fd))
        << name << "[" << i << "] (max |grad| " << max_grad << ")";
  }
}

TEST_P(FiniteDifferences, BackwardMatchesCentralDifferences) {
  const GradCase& c = GetParam();
  Problem pr;
  pr.maps = c.maps;
  pr.B = c.B;
  pr.Tq = c.Tq;
  pr.Tk = c.Tk;
  pr.H = c.H;
  pr.G = c.G;
  pr.D = c.D;
  pr.Dv = c.Dv;
  pr.shared_keys = c.shared_keys;
  pr.lam_per_token = c.lam_per_token;
  pr.causal = c.causal;
  pr.randomize(1234, c.lam_lo, c.lam_hi);
  const std::vector<float> R = testing::randn(pr.B * pr.Tq * pr.H * pr.Dv, 99);
  const testing::BwdResult g = testing::run_bwd(pr, R);
  check_tensor("q", pr, pr.q, g.dq, R);
  check_tensor("k", pr, pr.k, g.dk, R);
  check_tensor("v", pr, pr.v, g.dv, R);
  if (c.maps == 2) check_tensor("lam", pr, pr.lam, g.dlam, R);
}

INSTANTIATE_TEST_SUITE_P(
    Reference, FiniteDifferences,
    ::testing::Values(
        GradCase{"v1_pair", 2, 1, 4, 4, 1, 1, 3, 6, false, false, false, 0.2f, 0.8f},
        GradCase{"v1_causal_gqa", 2, 2, 5, 5, 2, 1, 3, 6, false, false, true, 0.2f, 0.8f},
        GradCase{"v2_token_lam", 2, 1, 4, 6, 2, 2, 4, 4, true, true, false, 0.0f, 1.0f},
        GradCase{"v2_causal_tq_lt_tk", 2, 1, 3, 6, 2, 1, 3, 3, true, true, true, 0.1f, 0.9f},
        GradCase{"v1_causal_tq_gt_tk", 2, 1, 6, 3, 1, 1, 2, 4, false, false, true, 0.1f, 0.9f},
        GradCase{"lambda_outside_unit", 2, 1, 4, 4, 2, 2, 3, 6, false, true, false, -0.8f, 1.7f},
        GradCase{"standard", 1, 2, 4, 5, 2, 1, 3, 5, false, false, false, 0, 0},
        GradCase{"standard_causal", 1, 1, 5, 5, 2, 2, 4, 4, false, false, true, 0, 0}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- numerical edge cases ----

TEST(EdgeCases, HugeLogitsGiveFiniteOneHotMaps) {
  Problem pr;
  pr.B = 1, pr.Tq = 3, pr.Tk = 7, pr.H = 1, pr.G = 1, pr.D = 4, pr.Dv = 8;
  pr.randomize(7);
  // Scores near +-1e4: scale the queries up.
  for (float& x : pr.q) x *= 4e3f;
  for (float sign : {1.0f, -1.0f}) {
    for (float& x : pr.q) x *= sign;
    const testing::FwdResult f = testing::run_fwd(pr);
    EXPECT_TRUE(testing::all_finite(f.out));
    EXPECT_TRUE(testing::all_finite(f.lse));
    const testing::BwdResult g = testing::run_bwd(pr, testing::randn(f.out.size(), 3));
    EXPECT_TRUE(testing::all_finite(g.dq) && testing::all_finite(g.dk) &&
                testing::all_finite(g.dv) && testing::all_finite(g.dlam));
  }
}

TEST(EdgeCases, ClampRowThatClampsToAllZerosStaysZero) {
  // Identical maps (q1 = q2, k1 = k2) and lambda = 1.5: every weight is (1 - 1.5) A1 < 0.
  Problem pr;
  pr.B = 1, pr.Tq = 4, pr.Tk = 4, pr.H = 1, pr.G = 1, pr.D = 3, pr.Dv = 6;
  pr.mode = kernels::DiffMode::Clamp;
  pr.randomize(11);
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t d = 0; d < 3; ++d) {
      pr.q[t * 6 + 3 + d] = pr.q[t * 6 + d];
      pr.k[t * 6 + 3 + d] = pr.k[t * 6 + d];
    }
  }
  pr.lam = {1.5f};
  const testing::FwdResult f = testing::run_fwd(pr);
  for (float x : f.out) EXPECT_EQ(x, 0.0f);
}

TEST(EdgeCases, RowsThatSeeNoKeyAreZeroWithZeroGradients) {
  // Causal bottom-right with Tq > Tk: query i sees keys j <= i - 3, so rows 0..2 see none.
  Problem pr;
  pr.B = 1, pr.Tq = 5, pr.Tk = 2, pr.H = 1, pr.G = 1, pr.D = 2, pr.Dv = 4;
  pr.causal = true;
  pr.randomize(5);
  const testing::FwdResult f = testing::run_fwd(pr);
  for (int i = 0; i < 3; ++i) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(f.out[i * 4 + c], 0.0f);
    EXPECT_TRUE(std::isinf(f.lse[i]) && f.lse[i] > 0);
  }
  EXPECT_TRUE(std::isfinite(f.lse[3]));
  const testing::BwdResult g = testing::run_bwd(pr, testing::randn(f.out.size(), 8));
  for (int i = 0; i < 3 * 2 * 2; ++i) EXPECT_EQ(g.dq[i], 0.0f);  // rows 0..2, both sub-heads
  EXPECT_TRUE(testing::all_finite(g.dk) && testing::all_finite(g.dv));
}

TEST(EdgeCases, LambdaBelowZeroAndAboveOneIsLinearInLambda) {
  // Nothing clamps lambda: out(lam) = A1 V - lam A2 V for any real lam.
  Problem pr;
  pr.B = 1, pr.Tq = 6, pr.Tk = 6, pr.H = 2, pr.G = 2, pr.D = 4, pr.Dv = 8;
  pr.randomize(21);
  pr.lam = {0.0f, 0.0f};
  const testing::FwdResult f0 = testing::run_fwd(pr);
  for (float lam : {-0.7f, 1.6f, 3.0f}) {
    pr.lam = {lam, lam};
    const testing::FwdResult f = testing::run_fwd(pr);
    for (size_t i = 0; i < f.out.size(); ++i) {
      EXPECT_NEAR(f.out[i], f0.out[i] - lam * f0.o2[i], 1e-5f);
    }
  }
}

TEST(EdgeCases, SingleTokenAndEmptyBatch) {
  Problem pr;
  pr.B = 1, pr.Tq = 1, pr.Tk = 1, pr.H = 1, pr.G = 1, pr.D = 1, pr.Dv = 1;
  pr.randomize(2);
  const testing::FwdResult f = testing::run_fwd(pr);
  // One key: both maps are 1, out = (1 - lam) v.
  EXPECT_NEAR(f.out[0], (1.0f - pr.lam[0]) * pr.v[0], 1e-6f);
  pr.B = 0;
  pr.randomize(2);
  const testing::FwdResult e = testing::run_fwd(pr);
  EXPECT_TRUE(e.out.empty());
}

// ---- bad input ----

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Errors, ShapesAreNamedWithExpectedAndActual) {
  std::vector<float> buf(4096, 0.5f);
  const float* d = buf.data();
  auto diff = [&](Shape q, Shape k, Shape v, Shape lam) {
    return error_of([&] { kernels::diff_attn_params({d, q}, {d, k}, {d, v}, {d, lam}, kernels::AttnOptions{}); });
  };
  std::string e = diff({1, 5, 2}, {1, 5, 2, 2}, {1, 5, 1, 4}, {1});
  EXPECT_NE(e.find("q has shape (1, 5, 2) (rank 3), expected rank 4 (B, Tq, 2H, D)"),
            std::string::npos) << e;
  e = diff({1, 5, 3, 2}, {1, 5, 2, 2}, {1, 5, 1, 4}, {1});
  EXPECT_NE(e.find("must be even"), std::string::npos) << e;
  e = diff({1, 5, 2, 2}, {1, 5, 3, 2}, {1, 5, 1, 4}, {1});
  EXPECT_NE(e.find("k has shape (1, 5, 3, 2), expected (B, Tk, 2G, D) = (1, 5, 2, 2)"),
            std::string::npos) << e;
  EXPECT_NE(e.find("(B, Tk, G, D) = (1, 5, 1, 2)"), std::string::npos) << e;
  e = diff({1, 5, 2, 2}, {1, 6, 2, 2}, {1, 5, 1, 4}, {1});
  EXPECT_NE(e.find("k has shape (1, 6, 2, 2)"), std::string::npos) << e;
  e = diff({2, 5, 2, 2}, {2, 5, 2, 2}, {1, 5, 1, 4}, {1});
  EXPECT_NE(e.find("v has shape (1, 5, 1, 4), expected (B, Tk, G, Dv) = (2, 5, 1, 4)"),
            std::string::npos) << e;
  e = diff({1, 5, 6, 2}, {1, 5, 4, 2}, {1, 5, 2, 4}, {3});
  EXPECT_NE(e.find("H = 3 pairs"), std::string::npos) << e;
  EXPECT_NE(e.find("not divisible by G = 2"), std::string::npos) << e;
  e = diff({1, 5, 2, 2}, {1, 5, 2, 2}, {1, 5, 1, 4}, {2});
  EXPECT_NE(e.find("lam has shape (2,), expected (H) = (1,)"), std::string::npos) << e;
  e = diff({1, 5, 2, 2}, {1, 5, 2, 2}, {1, 5, 1, 4}, {1, 4, 1});
  EXPECT_NE(e.find("lam has shape (1, 4, 1), expected (B, Tq, H) = (1, 5, 1)"),
            std::string::npos) << e;
  e = error_of([&] {
    kernels::attn_params({d, {1, 5, 2, 4}}, {d, {1, 5, 2, 3}}, {d, {1, 5, 2, 4}}, kernels::AttnOptions{});
  });
  EXPECT_NE(e.find("attention: k has shape (1, 5, 2, 3), expected (B, Tk, G, D) = (1, 5, 2, 4)"),
            std::string::npos) << e;
}

TEST(Errors, NanLambdaIsRejectedByTheDataCheck) {
  // check_lambda reads lambda (the Python and CLI surfaces call it); check_params reads no
  // tensor data, so the kernels themselves see a NaN lambda and give NaN, never a finite lie.
  Problem pr = textbook_problem(kernels::DiffMode::Signed, NAN);
  std::vector<float> out(20);
  kernels::AttnParams p = pr.params();
  p.out = out.data();
  const std::string e = error_of([&] { kernels::check_lambda(p, "diff_attention"); });
  EXPECT_NE(e.find("lam[0] is nan"), std::string::npos) << e;
  EXPECT_NO_THROW(kernels::check_params(p, "diff_attention"));
  for (kernels::Backend b : {kernels::Backend::Reference, kernels::Backend::Fused}) {
    const testing::FwdResult r = testing::run_fwd(pr, b);
    EXPECT_TRUE(std::isnan(r.out[0])) << kernels::backend_name(b);
  }
  pr.lam = {INFINITY};
  p = pr.params();
  p.out = out.data();
  EXPECT_NE(error_of([&] { kernels::check_lambda(p, "diff_attention"); }).find("must be finite"),
            std::string::npos);
}

TEST(Errors, ClampModeHasNoBackward) {
  Problem pr = textbook_problem(kernels::DiffMode::Clamp);
  const std::string e = error_of([&] { testing::run_bwd(pr, std::vector<float>(20, 1.0f)); });
  EXPECT_NE(e.find("clamp mode has a forward only"), std::string::npos) << e;
}

}  // namespace
}  // namespace diffattn
