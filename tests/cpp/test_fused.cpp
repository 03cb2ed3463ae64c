// The fused CPU kernels (tiled forward, split-KV decode, backward) against the reference over
// awkward shapes, layouts, strides and numerical edge cases. The shapes are the catalogue of
// bench/cases/attn_case.h (which `diffattn bench --check` runs too) and so are the accuracy
// rules: a fused result may be at most a few times as wrong as a naive float32 computation of
// the same case (bench/cases/naive32.h), measured against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "bench/cases/attn_case.h"
#include "bench/cases/bench_cases.h"
#include "bench/cases/naive32.h"
#include "diffattn/kernels/attention.h"
#include "diffattn/kernels/runtime.h"
#include "simd_targets.h"
#include "testing.h"

namespace diffattn {
namespace {

using bench::AttnCase;
using testing::Problem;

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

void expect_ok(const bench::Comparison& c) { EXPECT_TRUE(c.ok()) << c.str(); }
void expect_ok(const std::vector<bench::Comparison>& cs) {
  for (const bench::Comparison& c : cs) expect_ok(c);
}

// The fused rule (attn_case.h): got within 8x the naive float32 error (plus 32 eps of the
// values' size) of truth. scale_floor: the size of the terms the values are made of, where the
// values themselves may cancel to exactly 0 (the gradient of q with a single visible key).
void expect_close(const char* name, const std::vector<float>& got, const std::vector<float>& truth,
                  const std::vector<float>& naive, double scale_floor = 1e-30) {
  expect_ok(bench::compare(name, got, truth, naive, scale_floor));
}

// Saved log-sum-exp: +inf exactly where the reference has +inf, else within 64 eps (1 + |lse|).
void expect_lse_close(const std::vector<float>& got, const std::vector<float>& truth) {
  expect_ok(bench::compare_lse(got, truth));
}

// The case's problem with its seeded inputs (bench::make_inputs).
Problem problem_of(const AttnCase& c, uint32_t seed) {
  Problem pr;
  pr.maps = c.maps;
  pr.B = c.B, pr.Tq = c.Tq, pr.Tk = c.Tk, pr.H = c.H, pr.G = c.G, pr.D = c.D, pr.Dv = c.Dv;
  pr.shared_keys = c.shared_keys;
  pr.lam_per_token = c.lam_per_token;
  pr.causal = c.causal;
  pr.mode = c.mode;
  bench::CaseInputs in = bench::make_inputs(c, seed);
  pr.q = std::move(in.q), pr.k = std::move(in.k), pr.v = std::move(in.v);
  pr.lam = std::move(in.lam);
  return pr;
}

void check_forward(const Problem& pr, const char* what) {
  SCOPED_TRACE(what);
  expect_ok(bench::check_fwd(pr.params()));
}

void check_backward(const Problem& pr) {
  expect_ok(bench::check_bwd(pr.params(), bench::randn(pr.B * pr.Tq * pr.H * pr.Dv, 77)));
}

class Fused : public ::testing::TestWithParam<AttnCase> {};

TEST_P(Fused, ForwardSignedMatchesReference) {
  check_forward(problem_of(GetParam(), 11), "signed");
}

TEST_P(Fused, ForwardClampMatchesReference) {
  if (GetParam().maps == 1) GTEST_SKIP() << "clamp is a differential mode";
  Problem pr = problem_of(GetParam(), 12);
  pr.mode = kernels::DiffMode::Clamp;
  check_forward(pr, "clamp");
}

TEST_P(Fused, BackwardMatchesReference) { check_backward(problem_of(GetParam(), 13)); }

TEST_P(Fused, OneAndTwoThreadsAgreeAndRepeatExactly) {
  const Problem pr = problem_of(GetParam(), 14);
  const std::vector<float> dout = bench::randn(pr.B * pr.Tq * pr.H * pr.Dv, 78);
  const int saved = kernels::num_threads();
  kernels::set_num_threads(1);
  const testing::BwdResult one = testing::run_bwd(pr, dout, kernels::Backend::Fused);
  const testing::FwdResult f1 = testing::run_fwd(pr, kernels::Backend::Fused);
  kernels::set_num_threads(2);
  const testing::BwdResult two = testing::run_bwd(pr, dout, kernels::Backend::Fused);
  const testing::BwdResult again = testing::run_bwd(pr, dout, kernels::Backend::Fused);
  const testing::FwdResult f2 = testing::run_fwd(pr, kernels::Backend::Fused);
  kernels::set_num_threads(saved);
  // Repeated runs with the same thread count are bit-identical (training resumes).
  EXPECT_EQ(std::memcmp(two.dq.data(), again.dq.data(), two.dq.size() * 4), 0);
  EXPECT_EQ(std::memcmp(two.dk.data(), again.dk.data(), two.dk.size() * 4), 0);
  EXPECT_EQ(std::memcmp(two.dv.data(), again.dv.data(), two.dv.size() * 4), 0);
  // 1 and 2 threads: the same within rounding (dQ partials sum in another order).
  const testing::BwdResult ref = testing::run_bwd(pr, dout, kernels::Backend::Reference);
  const bench::NaiveGrads naive = bench::naive_bwd(pr.params(), dout.data());
  const double terms = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  expect_close("dq 1 vs 2 threads", one.dq, two.dq, naive.dq, terms);
  expect_close("dk 1 vs 2 threads", one.dk, two.dk, naive.dk, terms);
  expect_close("out 1 vs 2 threads", f1.out, f2.out, bench::naive_fwd(pr.params()));
}

// Every backend's backward honours what the forward saved (lse, out, o2): given saved
// statistics that are off (a forward over other keys), the reference and fused backwards agree
// with each other and both differ from the oracle, which recomputes the maps.
TEST_P(Fused, EveryBackendHonoursTheSavedStatistics) {
  const Problem pr = problem_of(GetParam(), 15);
  if (pr.mode == kernels::DiffMode::Clamp) GTEST_SKIP() << "clamp mode has no backward";
  const std::vector<float> dout = bench::randn(pr.B * pr.Tq * pr.H * pr.Dv, 79);
  Problem other = pr;
  for (float& x : other.k) x *= 1.25f;  // saved statistics of another forward
  const testing::FwdResult f = testing::run_fwd(other, kernels::Backend::Reference);
  auto grads = [&](int which) {
    kernels::AttnBwdParams p(pr.params());
    p.out = f.out.data();
    p.lse = f.lse.data();
    p.o2 = pr.maps == 2 ? f.o2.data() : nullptr;
    p.dout = dout.data();
    testing::BwdResult r;
    r.dq.assign(pr.q.size(), NAN);
    r.dk.assign(pr.k.size(), NAN);
    r.dv.assign(pr.v.size(), NAN);
    p.dq = r.dq.data(), p.dk = r.dk.data(), p.dv = r.dv.data();
    if (pr.maps == 2) {
      r.dlam.assign(pr.lam.size(), NAN);
      p.dlam = r.dlam.data();
    }
    if (which == 0) kernels::attention_bwd(p, kernels::Backend::Reference);
    if (which == 1) kernels::attention_bwd(p, kernels::Backend::Fused);
    if (which == 2) kernels::attention_bwd_oracle(p);
    return r;
  };
  const testing::BwdResult ref = grads(0), fused = grads(1), oracle = grads(2);
  const double scale = std::max<double>({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv), 1e-30});
  auto diff = [&](const std::vector<float>& a, const std::vector<float>& b) { return max_diff(a, b) / scale; };
  const double agree = std::max<double>({diff(fused.dq, ref.dq), diff(fused.dk, ref.dk), diff(fused.dv, ref.dv)});
  const double apart = std::max<double>({diff(oracle.dq, ref.dq), diff(oracle.dk, ref.dk), diff(oracle.dv, ref.dv)});
  EXPECT_LT(agree, 1e-4) << "the reference and fused backwards read the saved statistics differently";
  EXPECT_GT(apart, 100 * std::max(agree, 1e-6)) << "the saved statistics made no difference";
  if (pr.maps == 2) {
    EXPECT_LT(max_diff(fused.dlam, ref.dlam), 1e-4 * std::max(max_abs(ref.dlam), 1.0));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fused, ::testing::ValuesIn(bench::fused_test_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- decode entry point ----

TEST(FusedDecode, ExplicitEntryWithManySplitsMatchesReference) {
  for (int64_t Tq : {1, 3}) {
    for (bool causal : {false, true}) {
      Problem pr = problem_of(AttnCase{"", 2, 2, Tq, 1000, 4, 2, 16, 32, false, true, causal}, 31);
      kernels::AttnDecodeParams p(pr.params());
      p.key_chunk = 100;  // rounded up to whole tiles: 128 keys, 8 splits
      testing::FwdResult ref = testing::run_fwd(pr, kernels::Backend::Reference), got = ref;
      std::fill(got.out.begin(), got.out.end(), NAN);
      std::fill(got.lse.begin(), got.lse.end(), NAN);
      p.out = got.out.data();
      p.lse = got.lse.data();
      p.o2 = got.o2.data();
      kernels::attention_decode(p);
      const std::vector<float> naive = bench::naive_fwd(pr.params());
      SCOPED_TRACE("Tq " + std::to_string(Tq) + (causal ? " causal" : ""));
      expect_close("out", got.out, ref.out, naive);
      expect_lse_close(got.lse, ref.lse);
    }
  }
}

// ---- 16-bit K/V (a BF16 or F16 KV cache) ----

// pr's K/V rounded to dt and stored as 16 bits (bench::Kv16); params() reads them (k16/v16).
struct Kv16 : bench::Kv16 {
  Kv16(const Problem& pr, DType dt) : bench::Kv16(pr.k, pr.v, dt) {}
  kernels::AttnParams params(const Problem& pr, testing::FwdResult& res) const {
    kernels::AttnParams p = pr.params();
    use_in(p);
    res.out.assign(static_cast<size_t>(p.numel(p.out_shape())), NAN);
    res.lse.assign(static_cast<size_t>(p.numel(p.lse_shape())), NAN);
    p.out = res.out.data();
    p.lse = res.lse.data();
    if (p.maps == 2) {
      res.o2.assign(res.out.size(), NAN);
      p.o2 = res.o2.data();
    }
    return p;
  }
};

// The tolerance rule of low-precision tests (FlashAttention's; attn_case.h): against the
// float64 reference on the unrounded inputs, the result may be at most 2x as wrong as a plain
// computation in that dtype (K/V rounded to it, naive float32 arithmetic), plus float32
// rounding of the size of the values; a rounding that changed nothing fails (vacuous).
void expect_within_dtype_error(const char* name, const std::vector<float>& got,
                               const std::vector<float>& truth64, const std::vector<float>& plain) {
  expect_ok(bench::compare_dtype(name, got, truth64, plain));
}

// The builders take K/V views in 16 bits (the model's cache path) and fill the params as a
// call set up by hand does; a K and V of different types, or of an unsupported one, are refused.
TEST(FusedDecode, BuildersTakeSixteenBitKVViews) {
  const AttnCase& c = bench::cache16_test_cases().front();
  const Problem pr = problem_of(c, 17);
  const Kv16 kv(pr, DType::F16);
  testing::FwdResult by_hand_res;
  const kernels::AttnParams by_hand = kv.params(pr, by_hand_res);
  kernels::AttnOptions o;
  o.causal = pr.causal, o.scale = pr.scale, o.mode = pr.mode;
  const TensorView q(pr.q.data(), pr.q_shape()), k(kv.k.data(), DType::F16, pr.k_shape()),
      v(kv.v.data(), DType::F16, pr.v_shape());
  kernels::AttnParams built = pr.maps == 2 ? kernels::diff_attn_params(q, k, v, {pr.lam.data(), pr.lam_shape()}, o)
                                           : kernels::attn_params(q, k, v, o);
  built.noise_share = pr.noise_share;
  EXPECT_EQ(built.kv_dtype, DType::F16);
  EXPECT_EQ(built.k, by_hand.k);
  EXPECT_EQ(built.v, by_hand.v);
  EXPECT_EQ(built.k_row_stride, by_hand.k_row_stride);
  EXPECT_EQ(built.v_batch_stride, by_hand.v_batch_stride);
  testing::FwdResult built_res = by_hand_res;
  built.out = built_res.out.data(), built.lse = built_res.lse.data();
  built.o2 = built.maps == 2 ? built_res.o2.data() : nullptr;
  kernels::attention_fwd(by_hand);
  kernels::attention_fwd(built);
  EXPECT_EQ(built_res.out, by_hand_res.out);
  auto refused = [&](const TensorView& qq, const TensorView& kk, const TensorView& vv, const std::string& words) {
    try {
      if (pr.maps == 2) {
        kernels::diff_attn_params(qq, kk, vv, {pr.lam.data(), pr.lam_shape()}, o);
      } else {
        kernels::attn_params(qq, kk, vv, o);
      }
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(q, k, TensorView(pr.v.data(), pr.v_shape()), "k is F16 and v is F32: K and V must have one type");
  refused(TensorView(kv.k.data(), DType::F16, pr.q_shape()), k, v, "q is F16, expected float32");
}

TEST(FusedDecode, Cache16MatchesFloat64ReferenceAndTheFloat32Path) {
  for (const AttnCase& c : bench::cache16_test_cases()) {
    for (const DType dt : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const Problem pr = problem_of(c, 61);
      const Kv16 kv(pr, dt);
      Problem rounded = pr;  // the float32 path on the rounded values
      rounded.k = kv.k_rounded;
      rounded.v = kv.v_rounded;
      const testing::FwdResult truth64 = testing::run_fwd(pr, kernels::Backend::Reference);
      const std::vector<float> plain = bench::naive_fwd(rounded.params());
      const testing::FwdResult truth_r = testing::run_fwd(rounded, kernels::Backend::Reference);
      const testing::FwdResult f32_r = testing::run_fwd(rounded, kernels::Backend::Fused);
      const std::vector<float> naive_r = plain;
      for (int route = 0; route < 3; ++route) {
        SCOPED_TRACE(route == 0 ? "auto" : route == 1 ? "attention_decode, 5 splits" : "reference");
        testing::FwdResult got;
        kernels::AttnParams p = kv.params(pr, got);
        if (route == 0) {
          kernels::attention_fwd(p);
        } else if (route == 1) {
          kernels::AttnDecodeParams dp(p);
          dp.key_chunk = (c.Tk + 4) / 5;
          kernels::attention_decode(dp);
        } else {
          kernels::attention_fwd(p, kernels::Backend::Reference);
        }
        expect_within_dtype_error("out", got.out, truth64.out, plain);
        // Against the float32 path on the same (rounded) values: float32 rounding only.
        expect_close("out vs reference on rounded K/V", got.out, truth_r.out, naive_r);
        expect_close("out vs float32 fused on rounded K/V", got.out, f32_r.out, naive_r);
        expect_lse_close(got.lse, truth_r.lse);
        if (c.maps == 2) expect_close("o2", got.o2, truth_r.o2, naive_r);
      }
    }
  }
}

// The decode kernel scores a whole vector of keys per step when a key head is a whole number
// of vectors (D = 64, 32 on every target; D = 24 on AVX2 only, key by key elsewhere): each SIMD
// target against the reference, with tiles cut short by odd lengths and splits, Tq in {1, 3},
// standard, V1 and V2 (GQA), float32 and BF16 K/V.
TEST(FusedDecode, EverySimdTargetMatchesReference) {
  const std::vector<AttnCase> cases = {
      {"v1_d64", 2, 1, 1, 1037, 2, 2, 64, 128, false, false, true},
      {"v2_gqa_d32", 2, 2, 1, 777, 4, 2, 32, 32, true, true, true},
      {"standard_d24", 1, 1, 1, 531, 4, 2, 24, 40, false, false, true},
  };
  testing::for_each_target([&] {
    for (const AttnCase& base : cases) {
      for (int64_t Tq : {1, 3}) {
        for (int64_t chunk : {0, 100}) {
          const AttnCase c = base.with_lengths(Tq, base.Tk);
          const Problem pr = problem_of(c, 71);
          kernels::AttnDecodeParams p(pr.params());
          p.key_chunk = chunk;
          testing::FwdResult ref = testing::run_fwd(pr, kernels::Backend::Reference), got = ref;
          std::fill(got.out.begin(), got.out.end(), NAN);
          p.out = got.out.data();
          p.lse = got.lse.data();
          if (c.maps == 2) p.o2 = got.o2.data();
          kernels::attention_decode(p);
          SCOPED_TRACE(c.name + " Tq " + std::to_string(Tq) + " chunk " + std::to_string(chunk));
          expect_close("out", got.out, ref.out, bench::naive_fwd(pr.params()));
          expect_lse_close(got.lse, ref.lse);
          // The same cache stored as BF16: against the float64 reference on the rounded K/V.
          const Kv16 kv(pr, DType::BF16);
          testing::FwdResult got16;
          kernels::AttnDecodeParams p16(kv.params(pr, got16));
          p16.key_chunk = chunk;
          kernels::attention_decode(p16);
          Problem rounded = pr;
          rounded.k = kv.k_rounded;
          rounded.v = kv.v_rounded;
          expect_close("out BF16 K/V", got16.out, testing::run_fwd(rounded).out,
                       bench::naive_fwd(rounded.params()));
        }
      }
    }
  });
}

TEST(FusedDecode, Cache16RefusedWhereFloat32IsNeeded) {
  const Problem pr = problem_of(AttnCase{"", 2, 1, 1, 300, 2, 1, 8, 16, false, false, true}, 62);
  const Kv16 kv(pr, DType::BF16);
  testing::FwdResult res;
  kernels::AttnParams p = kv.params(pr, res);
  kernels::AttnBwdParams bp(p);
  std::vector<float> dout(res.out.size(), 1.0f), dq(pr.q.size()), dk(pr.k.size()), dv(pr.v.size()),
      dlam(pr.lam.size());
  bp.dout = dout.data(), bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data(),
  bp.dlam = dlam.data();
  for (kernels::Backend be : {kernels::Backend::Fused, kernels::Backend::Reference}) {
    try {
      kernels::attention_bwd(bp, be);
      ADD_FAILURE() << "the backward took a BF16 k/v";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("BF16"), std::string::npos) << e.what();
    }
  }
  std::vector<float> probs(static_cast<size_t>(p.B * p.H * p.Tq * p.Tk));
  kernels::attention_fwd(p);
  EXPECT_THROW(kernels::attention_probs(p, 0, probs.data()), InvalidArgument);
  kernels::AttnParams unknown = p;  // K and V are one typed pointer each: only the type can be wrong
  unknown.kv_dtype = static_cast<DType>(7);
  EXPECT_THROW(kernels::attention_fwd(unknown), InvalidArgument);
  kernels::AttnParams missing = p;
  missing.v = nullptr;
  EXPECT_THROW(kernels::attention_fwd(missing), InvalidArgument);
}

// ---- paged decode: B sequences of different lengths, K/V in blocks of one pool ----

// One variant of the operator, as the paged tests walk them.
// B sequences of one variant (an attention case of one causal query row; its Tk is each
// sequence's length), each a decode problem of its own (the oracle's input),
// and the same K/V written into a pool of blocks in shuffled order, with the block tables
// and lengths a paged call reads. 16-bit: the pools hold K/V rounded to dt, and the
// per-sequence problems `rounded` the same values as float32.
struct PagedCase {
  AttnCase var;
  int64_t bs;
  DType dt;
  std::vector<Problem> seqs, rounded;
  std::vector<float> q, lam, kpool, vpool;
  std::vector<uint16_t> k16, v16;
  std::vector<int32_t> tables;
  std::vector<int64_t> lens;
  // Query rows per sequence (its last positions), and q_starts; empty: one row each (decode).
  std::vector<int64_t> rows, starts;
  int64_t n_blocks = 0, stride = 0;

  PagedCase(const AttnCase& v, int64_t block_size, DType dtype,
            const std::vector<int64_t>& lengths, uint32_t seed,
            const std::vector<int64_t>& query_rows = {})
      : var(v), bs(block_size), dt(dtype), lens(lengths), rows(query_rows) {
    const int64_t B = static_cast<int64_t>(lens.size()), KH = key_heads();
    const int64_t krow = KH * v.D, vrow = v.G * v.Dv;
    if (!rows.empty()) {
      starts.assign(1, 0);
      for (const int64_t n : rows) starts.push_back(starts.back() + n);
    }
    std::vector<float> shared_lam;
    for (int64_t b = 0; b < B; ++b) {
      Problem pr = problem_of(v.with_lengths(n_rows(b), lens[static_cast<size_t>(b)]),
                              seed + 10 * static_cast<uint32_t>(b));
      if (v.maps == 2 && !v.lam_per_token) {  // one lambda (H) for the whole call
        if (b == 0) shared_lam = pr.lam;
        pr.lam = shared_lam;
      }
      q.insert(q.end(), pr.q.begin(), pr.q.end());
      if (v.maps == 2 && (v.lam_per_token || b == 0)) lam.insert(lam.end(), pr.lam.begin(), pr.lam.end());
      Problem r = pr;
      if (dt != DType::F32) {  // the values the 16-bit pool holds
        bench::Kv16 kv(pr.k, pr.v, dt);
        r.k = std::move(kv.k_rounded);
        r.v = std::move(kv.v_rounded);
      }
      seqs.push_back(std::move(pr));
      rounded.push_back(std::move(r));
    }
    // Block ids: every sequence's blocks drawn from a shuffled pool with spare blocks, so no
    // table is contiguous or in order; unused table entries hold -1 (never read).
    int64_t need = 0;
    for (int64_t len : lens) {
      need += (len + bs - 1) / bs;
      stride = std::max(stride, (len + bs - 1) / bs);
    }
    stride += 2;
    n_blocks = need + 5;
    std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
    for (int64_t i = 0; i < n_blocks; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::mt19937 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables.assign(static_cast<size_t>(B * stride), -1);
    kpool.assign(static_cast<size_t>(n_blocks * bs * krow), NAN);  // unused rows: NaN
    vpool.assign(static_cast<size_t>(n_blocks * bs * vrow), NAN);
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = lens[static_cast<size_t>(b)];
      for (int64_t i = 0; i < (len + bs - 1) / bs; ++i) {
        tables[static_cast<size_t>(b * stride + i)] = ids[next++];
      }
      const Problem& r = rounded[static_cast<size_t>(b)];
      for (int64_t j = 0; j < len; ++j) {
        const int64_t at = tables[static_cast<size_t>(b * stride + j / bs)] * bs + j % bs;
        std::copy_n(&r.k[static_cast<size_t>(j * krow)], krow, &kpool[static_cast<size_t>(at * krow)]);
        std::copy_n(&r.v[static_cast<size_t>(j * vrow)], vrow, &vpool[static_cast<size_t>(at * vrow)]);
      }
    }
    if (dt != DType::F32) {  // exact: the pool's floats are already rounded to dt
      k16.resize(kpool.size());
      v16.resize(vpool.size());
      convert_from_f32(k16.data(), kpool.data(), dt, static_cast<int64_t>(kpool.size()));
      convert_from_f32(v16.data(), vpool.data(), dt, static_cast<int64_t>(vpool.size()));
    }
  }
  int64_t key_heads() const { return var.sizes().key_heads(); }
  int64_t n_rows(int64_t b) const { return rows.empty() ? 1 : rows[static_cast<size_t>(b)]; }
  int64_t total_rows() const { return rows.empty() ? static_cast<int64_t>(lens.size()) : starts.back(); }
  int64_t row0(int64_t b) const { return rows.empty() ? b : starts[static_cast<size_t>(b)]; }

  kernels::PagedAttnParams params(std::vector<float>& out) const {
    kernels::PagedAttnParams p;
    p.B = static_cast<int64_t>(lens.size());
    p.q_starts = rows.empty() ? nullptr : starts.data();
    p.H = var.H, p.G = var.G, p.D = var.D, p.Dv = var.Dv, p.maps = var.maps;
    p.shared_keys = var.shared_keys, p.lam_per_token = var.lam_per_token;
    p.scale = 1.0f / std::sqrt(static_cast<float>(var.D));
    p.n_blocks = n_blocks, p.block_size = bs, p.table_stride = stride;
    p.q = q.data();
    p.lam = var.maps == 2 ? lam.data() : nullptr;
    p.kv_dtype = dt;
    if (dt == DType::F32) {
      p.k_pool = kpool.data(), p.v_pool = vpool.data();
    } else {
      p.k_pool = k16.data(), p.v_pool = v16.data();
    }
    p.block_tables = tables.data();
    p.seq_lens = lens.data();
    p.set_contiguous_strides();
    out.assign(static_cast<size_t>(total_rows() * var.H * var.Dv), NAN);
    p.out = out.data();
    return p;
  }
  // Sequence b's rows of a paged call's out.
  std::vector<float> rows_of(const std::vector<float>& out, int64_t b) const {
    const int64_t n = var.H * var.Dv;
    return {out.begin() + row0(b) * n, out.begin() + (row0(b) + n_rows(b)) * n};
  }

  // Sequence b alone through the contiguous split-KV decode (attention_decode), K/V as the
  // pool holds them (16-bit read in place), with key_chunk: out (H, Dv).
  std::vector<float> contiguous_decode(int64_t b, int64_t key_chunk) const {
    const Problem& pr = seqs[static_cast<size_t>(b)];
    kernels::AttnDecodeParams p(rounded[static_cast<size_t>(b)].params());
    std::optional<bench::Kv16> kv;
    if (dt != DType::F32) {
      kv.emplace(pr.k, pr.v, dt, /*keep_rounded=*/false);
      kv->use_in(p);
    }
    std::vector<float> out(static_cast<size_t>(var.H * var.Dv), NAN);
    p.out = out.data();
    p.key_chunk = key_chunk;
    kernels::attention_decode(p);
    return out;
  }
};

const AttnCase kPagedVariants[] = {
    // name, maps, B, Tq, Tk (each sequence's length), H, G, D, Dv, shared keys (V2), lambda per
    // token, causal
    {"v1", 2, 1, 1, 1, 4, 2, 16, 32, false, false, true},
    {"v2", 2, 1, 1, 1, 4, 4, 16, 16, true, true, true},
    {"standard", 1, 1, 1, 1, 4, 2, 16, 16, false, false, true},
    {"v1_odd_dims", 2, 1, 1, 1, 2, 1, 5, 7, false, false, true},  // neither D nor Dv a vector
};

std::vector<int64_t> paged_lengths(int64_t bs) { return {1, bs - 1, bs, bs + 1, 700, 37}; }

// The paged call of pc with key_chunk on one thread and on two: {one, two}.
std::pair<std::vector<float>, std::vector<float>> one_and_two_threads(const PagedCase& pc,
                                                                      int64_t key_chunk) {
  const int saved = kernels::num_threads();
  std::vector<float> one, two;
  kernels::PagedAttnParams p1 = pc.params(one), p2 = pc.params(two);
  p1.key_chunk = p2.key_chunk = key_chunk;
  kernels::set_num_threads(1);
  kernels::attention_paged(p1);
  kernels::set_num_threads(2);
  kernels::attention_paged(p2);
  kernels::set_num_threads(saved);
  return {std::move(one), std::move(two)};
}

std::vector<float> slice(const std::vector<float>& x, int64_t b, int64_t n) {
  return {x.begin() + b * n, x.begin() + (b + 1) * n};
}

// Against the reference and the naive float32 computation of each sequence alone (K/V as the
// pool holds them): the fused-kernel tolerance. With blocks of 16 positions (the P V products
// never straddle a block end) the paged call is attention_decode's arithmetic on each sequence:
// bit for bit, at any thread count.
TEST(FusedDecodePaged, MatchesEachSequenceAloneForEveryVariantDtypeAndBlockSize) {
  for (const AttnCase& var : kPagedVariants) {
    for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
      for (const int64_t bs : {16, 7, 32}) {
        SCOPED_TRACE(var.name + " " + dtype_name(dt) + " block " + std::to_string(bs));
        const PagedCase pc(var, bs, dt, paged_lengths(bs), 71);
        const int64_t B = static_cast<int64_t>(pc.lens.size()), n = var.H * var.Dv;
        for (const int64_t chunk : {0, 128}) {
          SCOPED_TRACE("key_chunk " + std::to_string(chunk));
          std::vector<float> out;
          kernels::PagedAttnParams p = pc.params(out);
          p.key_chunk = chunk;
          kernels::attention_paged(p);
          for (int64_t b = 0; b < B; ++b) {
            SCOPED_TRACE("sequence " + std::to_string(b) + " of length " +
                         std::to_string(pc.lens[static_cast<size_t>(b)]));
            const Problem& r = pc.rounded[static_cast<size_t>(b)];
            const std::vector<float> got = slice(out, b, n);
            expect_close("out", got, testing::run_fwd(r, kernels::Backend::Reference).out,
                         bench::naive_fwd(r.params()));
            if (chunk > 0 && bs % 16 == 0) {
              const std::vector<float> alone = pc.contiguous_decode(b, chunk);
              EXPECT_EQ(std::memcmp(got.data(), alone.data(), got.size() * sizeof(float)), 0)
                  << "not bit for bit the contiguous decode";
            }
          }
        }
      }
    }
  }
}

TEST(FusedDecodePaged, OneAndTwoThreadsAndTheReferenceBackend) {
  const PagedCase pc(kPagedVariants[0], 16, DType::F32, {3, 700, 1, 300, 15, 16, 17, 64}, 72);
  const auto [one, two] = one_and_two_threads(pc, 0);
  std::vector<float> ref;
  // Threads split sequences, head groups and keys; the splits and their merge order are fixed
  // by the lengths and key_chunk alone... except key_chunk = 0 picks from the thread count,
  // so compare within rounding, and bit for bit with a fixed key_chunk.
  std::vector<float> naive;
  for (size_t b = 0; b < pc.lens.size(); ++b) {
    const std::vector<float> nb = bench::naive_fwd(pc.rounded[b].params());
    naive.insert(naive.end(), nb.begin(), nb.end());
  }
  kernels::attention_paged(pc.params(ref), kernels::Backend::Reference);
  expect_close("1 thread", one, ref, naive);
  expect_close("2 threads", two, ref, naive);
  const auto [c1, c2] = one_and_two_threads(pc, 64);
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0);
}

// Calls big enough for two threads (>= 1 MiB of K/V a thread): one long sequence of 8 KiB key
// rows cut into 5 key splits, fewer than the 8 items two threads want, so each split is also
// cut into head-group slices; and 16 short sequences, one split each. Slices and splits
// change who computes a row, not its arithmetic: bit for bit what one thread computes, and
// what attention_decode computes for each sequence alone.
TEST(FusedDecodePaged, TwoThreadsSplitSequencesKeysAndHeadGroupsBitForBit) {
  const AttnCase wide{"v1_wide", 2, 1, 1, 1, 8, 8, 64, 128, false, false, true};
  const std::vector<std::vector<int64_t>> shapes = {
      {2100}, {40, 33, 17, 64, 5, 48, 40, 1, 16, 32, 40, 40, 39, 41, 60, 70}};
  for (const std::vector<int64_t>& lens : shapes) {
    SCOPED_TRACE(std::to_string(lens.size()) + " sequences");
    const PagedCase pc(wide, 16, DType::F32, lens, 75);
    const auto [one, two] = one_and_two_threads(pc, 512);
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
    const int64_t n = wide.H * wide.Dv;
    for (int64_t b = 0; b < static_cast<int64_t>(lens.size()); ++b) {
      const std::vector<float> alone = pc.contiguous_decode(b, 512);
      EXPECT_EQ(std::memcmp(&two[static_cast<size_t>(b * n)], alone.data(), alone.size() * 4), 0)
          << "sequence " << b;
    }
    const Problem& r = pc.rounded[0];
    expect_close("out of sequence 0", slice(two, 0, n), testing::run_fwd(r, kernels::Backend::Reference).out,
                 bench::naive_fwd(r.params()));
  }
}

// Strided q and out (q rows of a fused projection buffer, out rows with padding).
TEST(FusedDecodePaged, StridedQueryAndOutput) {
  const PagedCase pc(kPagedVariants[1], 16, DType::F32, {5, 40, 33}, 73);
  const int64_t B = 3, qh = 2 * pc.var.H, D = pc.var.D, H = pc.var.H, Dv = pc.var.Dv;
  std::vector<float> want;
  kernels::attention_paged(pc.params(want));
  const int64_t qrow = qh * D + 11, orow = H * (Dv + 3) + 5;
  std::vector<float> q(static_cast<size_t>(B * qrow), NAN), out(static_cast<size_t>(B * orow), -7.0f);
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(&pc.q[static_cast<size_t>(b * qh * D)], qh * D, &q[static_cast<size_t>(b * qrow)]);
  }
  std::vector<float> unused;
  kernels::PagedAttnParams p = pc.params(unused);
  p.q = q.data();
  p.q_row_stride = qrow;
  p.out = out.data();
  p.o_row_stride = orow;
  p.o_head_stride = Dv + 3;
  kernels::attention_paged(p);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < Dv; ++d) {
        ASSERT_EQ(out[static_cast<size_t>(b * orow + h * (Dv + 3) + d)],
                  want[static_cast<size_t>((b * H + h) * Dv + d)]);
      }
      EXPECT_EQ(out[static_cast<size_t>(b * orow + h * (Dv + 3) + Dv)], -7.0f);  // padding kept
    }
  }
}

// attention_paged(p) throws InvalidArgument whose message holds `what`.
void refused(const kernels::PagedAttnParams& p, const std::string& what) {
  try {
    kernels::attention_paged(p);
    ADD_FAILURE() << "accepted: " << what;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// Bad params are refused before anything is read, naming the field.
TEST(FusedDecodePaged, RefusesBadParamsNamingTheField) {
  const PagedCase pc(kPagedVariants[0], 16, DType::F32, {5, 40, 33}, 74);
  std::vector<float> out;
  std::vector<int32_t> tables = pc.tables;
  tables[static_cast<size_t>(1 * pc.stride + 2)] = static_cast<int32_t>(pc.n_blocks);
  kernels::PagedAttnParams p = pc.params(out);
  p.block_tables = tables.data();
  refused(p, "block_tables[1][2]");
  tables = pc.tables;
  tables[static_cast<size_t>(2 * pc.stride)] = -1;
  refused(p, "block_tables[2][0]");
  std::vector<int64_t> lens = pc.lens;
  lens[2] = pc.stride * 16 + 1;
  p = pc.params(out);
  p.seq_lens = lens.data();
  refused(p, "seq_lens[2]");
  lens[2] = -1;
  refused(p, "seq_lens[2]");
  p = pc.params(out);
  p.k_pool = nullptr;
  refused(p, "k_pool");
  p = pc.params(out);
  p.kv_dtype = static_cast<DType>(9);
  refused(p, "kv_dtype is not F32, BF16 or F16");
  p = pc.params(out);
  p.lam = nullptr;
  refused(p, "lam");
  p = pc.params(out);
  p.block_size = 0;
  refused(p, "block_size");
  p = pc.params(out);
  p.scale = 0.0f;
  refused(p, "scale");
  p = pc.params(out);
  p.o_head_stride = 0;  // every head onto the same row
  refused(p, "out");
  p = pc.params(out);
  p.H = 3;
  refused(p, "not divisible");
  // The table entries past a sequence's length are never read (they hold -1 here).
  p = pc.params(out);
  EXPECT_NO_THROW(kernels::attention_paged(p));
  p.B = 0;  // nothing to do
  EXPECT_NO_THROW(kernels::attention_paged(p));
}

// ---- paged attention with many query rows per sequence (prompt chunks) ----

// attention_paged's split-KV path takes a sequence's rows up to this many (the kernels'
// DecodeTiles::kMaxRows), the tiled forward more.
constexpr int64_t kSplitKvRows = 4;

// Sequence b alone as a contiguous problem, K/V as the pool holds them (16-bit: the same 16-bit
// values, read as attention_fwd reads a 16-bit cache): its out (n_rows, H, Dv). With
// `decode` the split-KV path at key_chunk (what attention_paged takes for <= 4 rows), else
// the tiled forward (for more).
std::vector<float> contiguous_rows(const PagedCase& pc, int64_t b, bool decode, int64_t key_chunk) {
  const Problem& pr = pc.seqs[static_cast<size_t>(b)];
  kernels::AttnDecodeParams p(pc.rounded[static_cast<size_t>(b)].params());
  std::optional<bench::Kv16> kv;
  if (pc.dt != DType::F32) {
    kv.emplace(pr.k, pr.v, pc.dt, /*keep_rounded=*/false);
    kv->use_in(p);
  }
  std::vector<float> out(static_cast<size_t>(pc.n_rows(b) * pc.var.H * pc.var.Dv), NAN);
  p.out = out.data();
  p.key_chunk = key_chunk;
  if (decode) {
    kernels::attention_decode(p);
  } else {
    EXPECT_GT(p.Tq, kSplitKvRows);
    kernels::attention_fwd(p);
  }
  return out;
}

// Sequences with 1, 2, 4 (the split-KV path) and 5, 37, 70 (the tiled forward) query rows at the
// end of histories that cross blocks and K/V tiles, in one call with a decode step beside them:
// each sequence's rows against the reference and the naive float32 computation of the
// sequence alone (the fused-kernel tolerance), and bit for bit what the contiguous kernel
// computes on the same keys (the tiled forward packs the same tiles from the blocks; the
// split-KV path reads the same rows when block ends fall on its 16-key tiles).
TEST(FusedPaged, PromptChunksReadTheBlocksInPlaceForEveryVariantDtypeAndBlockSize) {
  const std::vector<int64_t> lens = {1, 9, 300, 70, 40, 21, 133};
  const std::vector<int64_t> rows = {1, 2, 37, 70, 4, 5, 1};
  for (const AttnCase& var : kPagedVariants) {
    for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
      for (const int64_t bs : {16, 7}) {
        SCOPED_TRACE(var.name + " " + dtype_name(dt) + " block " + std::to_string(bs));
        const PagedCase pc(var, bs, dt, lens, 91, rows);
        std::vector<float> out;
        kernels::PagedAttnParams p = pc.params(out);
        p.key_chunk = 64;
        kernels::attention_paged(p);
        for (int64_t b = 0; b < static_cast<int64_t>(lens.size()); ++b) {
          SCOPED_TRACE("sequence " + std::to_string(b) + ": " + std::to_string(pc.n_rows(b)) +
                       " rows of " + std::to_string(lens[static_cast<size_t>(b)]));
          const Problem& r = pc.rounded[static_cast<size_t>(b)];
          const std::vector<float> got = pc.rows_of(out, b);
          expect_close("out", got, testing::run_fwd(r, kernels::Backend::Reference).out,
                       bench::naive_fwd(r.params()));
          const bool decode = pc.n_rows(b) <= kSplitKvRows;
          if (decode && bs % 16 != 0) continue;
          const std::vector<float> alone = contiguous_rows(pc, b, decode, 64);
          EXPECT_EQ(std::memcmp(got.data(), alone.data(), got.size() * sizeof(float)), 0)
              << "not bit for bit the contiguous " << (decode ? "split-KV decode" : "tiled forward");
        }
      }
    }
  }
}

// The reference backend (the oracle: each sequence gathered) against the fused one, on one and
// two threads; and a grouped noise map (noise_share 2, Motif-2's layout: the map-2 query rows of
// a run of pairs are copies) read once by the fused paths.
TEST(FusedPaged, PromptChunksOnOneAndTwoThreadsAndTheReferenceBackend) {
  const AttnCase wide{"v1_8_pairs", 2, 1, 1, 1, 8, 2, 16, 32, false, false, true};
  for (const AttnCase& var : {kPagedVariants[0], kPagedVariants[1], wide}) {
    for (const int64_t ns : {1, 2}) {
      if (ns == 2 && var.H != 8) continue;
      SCOPED_TRACE(var.name + " noise_share " + std::to_string(ns));
      PagedCase pc(var, 16, DType::BF16, {260, 3, 100}, 92, {200, 3, 1});
      const int64_t nh = 2 * var.H;
      for (int64_t row = 0; row < pc.total_rows() && ns > 1; ++row) {
        for (int64_t h = 0; h < var.H; ++h) {  // map-2 rows: the run's first pair's
          std::copy_n(&pc.q[static_cast<size_t>((row * nh + 2 * (h - h % ns) + 1) * var.D)], var.D,
                      &pc.q[static_cast<size_t>((row * nh + 2 * h + 1) * var.D)]);
        }
      }
      std::vector<float> ref, one, two;
      kernels::PagedAttnParams pr = pc.params(ref), p1 = pc.params(one), p2 = pc.params(two);
      p1.noise_share = p2.noise_share = ns;
      kernels::attention_paged(pr, kernels::Backend::Reference);
      const int saved = kernels::num_threads();
      kernels::set_num_threads(1);
      kernels::attention_paged(p1);
      kernels::set_num_threads(2);
      kernels::attention_paged(p2);
      kernels::set_num_threads(saved);
      if (ns > 1) {  // the copies changed q: the per-sequence problems no longer hold it
        const double tol = 1e-5 * (1 + max_abs(ref));
        EXPECT_LE(max_diff(one, ref), tol);
        EXPECT_LE(max_diff(two, ref), tol);
        continue;
      }
      std::vector<float> naive;
      for (size_t b = 0; b < pc.lens.size(); ++b) {
        const std::vector<float> nb = bench::naive_fwd(pc.rounded[b].params());
        naive.insert(naive.end(), nb.begin(), nb.end());
      }
      expect_close("1 thread", one, ref, naive);
      expect_close("2 threads", two, ref, naive);
    }
  }
}

// A NaN value in a chunk's last position reaches only the rows that see it (its own row): the
// rows before it stay finite, on both paths, as attention_fwd's causal calls have it.
TEST(FusedPaged, ANonFiniteValueReachesOnlyTheRowsThatSeeIt) {
  for (const int64_t n : {3, 20}) {
    SCOPED_TRACE(std::to_string(n) + " rows");
    PagedCase pc(kPagedVariants[0], 16, DType::F32, {50}, 93, {n});
    const int64_t vrow = pc.var.G * pc.var.Dv, last = 49;
    const int64_t at = pc.tables[static_cast<size_t>(last / 16)] * 16 + last % 16;
    pc.vpool[static_cast<size_t>(at * vrow)] = NAN;
    std::vector<float> out;
    kernels::attention_paged(pc.params(out));
    const int64_t per = pc.var.H * pc.var.Dv;
    for (int64_t t = 0; t + 1 < n; ++t) {
      for (int64_t i = 0; i < per; ++i) {
        ASSERT_TRUE(std::isfinite(out[static_cast<size_t>(t * per + i)])) << "row " << t;
      }
    }
    EXPECT_TRUE(std::isnan(out[static_cast<size_t>((n - 1) * per)]));
  }
}

// q_starts is checked before anything is read, naming the entry.
TEST(FusedPaged, RefusesBadQueryStarts) {
  const PagedCase pc(kPagedVariants[0], 16, DType::F32, {5, 40, 33}, 94, {2, 8, 1});
  std::vector<float> out;
  std::vector<int64_t> starts = pc.starts;
  kernels::PagedAttnParams p = pc.params(out);
  p.q_starts = starts.data();
  starts[0] = 1;
  refused(p, "q_starts[0] = 1");
  starts = pc.starts;
  starts[2] = 1;  // sequence 1 would have -1 rows
  refused(p, "q_starts[2] = 1 is below q_starts[1]");
  starts = {0, 6, 14, 15};  // sequence 0: 6 rows, 5 positions
  refused(p, "seq_lens[0] = 5 is fewer than the sequence's 6 query rows");
  starts = pc.starts;
  EXPECT_NO_THROW(kernels::attention_paged(p));
}

// ---- strided views: a fused QKV buffer and a KV cache with spare capacity ----

TEST(FusedStrides, StridedViewsGiveTheContiguousResult) {
  // q rows live in a fused QKV activation buffer (row stride > row); k and v in a cache of
  // capacity Tcap > Tk per batch (batch stride > Tk * row stride), rows padded too; out rows
  // padded. Packing makes the fused kernels' arithmetic independent of the layout, so the
  // strided results equal the contiguous ones exactly (and the reference's equal its own).
  const int64_t B = 2, Tq = 19, Tk = 83, H = 2, G = 1, D = 8, Dv = 16, Tcap = 101;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    const Problem pr = problem_of(AttnCase{"", 2, B, Tq, Tk, H, G, D, Dv, false, false, causal}, 41);
    const int64_t qrow = 2 * H * D + 5, krow = 2 * G * D + 3, vrow = G * Dv + 1,
                  orow = H * Dv + 4;
    std::vector<float> qbuf(B * Tq * qrow, NAN), kbuf(B * Tcap * krow, NAN),
        vbuf(B * Tcap * vrow, NAN);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < Tq; ++t)
        std::copy_n(&pr.q[(b * Tq + t) * 2 * H * D], 2 * H * D, &qbuf[(b * Tq + t) * qrow + 2]);
      for (int64_t t = 0; t < Tk; ++t) {
        std::copy_n(&pr.k[(b * Tk + t) * 2 * G * D], 2 * G * D, &kbuf[(b * Tcap + t) * krow]);
        std::copy_n(&pr.v[(b * Tk + t) * G * Dv], G * Dv, &vbuf[(b * Tcap + t) * vrow]);
      }
    }
    const std::vector<float> dout = bench::randn(B * Tq * H * Dv, 5);
    std::vector<float> dout_buf(B * Tq * orow, NAN);
    for (int64_t bt = 0; bt < B * Tq; ++bt)
      std::copy_n(&dout[bt * H * Dv], H * Dv, &dout_buf[bt * orow]);

    kernels::AttnParams p = pr.params();
    p.q = qbuf.data() + 2, p.q_row_stride = qrow, p.q_batch_stride = Tq * qrow;
    p.k = kbuf.data(), p.k_row_stride = krow, p.k_batch_stride = Tcap * krow;
    p.v = vbuf.data(), p.v_row_stride = vrow, p.v_batch_stride = Tcap * vrow;
    p.o_row_stride = orow, p.o_batch_stride = Tq * orow;
    for (kernels::Backend be : {kernels::Backend::Fused, kernels::Backend::Reference}) {
      SCOPED_TRACE(kernels::backend_name(be));
      const testing::BwdResult want_g = testing::run_bwd(pr, dout, be, true);
      const testing::FwdResult want = testing::run_fwd(pr, be);
      std::vector<float> obuf(B * Tq * orow, -7.0f), lse(want.lse.size()), o2(want.o2.size());
      p.out = obuf.data(), p.lse = lse.data(), p.o2 = o2.data();
      kernels::attention_fwd(p, be);
      for (int64_t bt = 0; bt < B * Tq; ++bt) {
        for (int64_t x = 0; x < H * Dv; ++x) EXPECT_EQ(obuf[bt * orow + x], want.out[bt * H * Dv + x]);
        for (int64_t x = H * Dv; x < orow; ++x) EXPECT_EQ(obuf[bt * orow + x], -7.0f);
      }
      EXPECT_EQ(lse, want.lse);
      EXPECT_EQ(o2, want.o2);

      // Backward through the same views: gradients land with their input's strides, and
      // nothing outside the views is written.
      kernels::AttnBwdParams bp(p);
      bp.dout = dout_buf.data();
      std::vector<float> dq(qbuf.size(), -3.0f), dk(kbuf.size(), -3.0f), dv(vbuf.size(), -3.0f),
          dlam(H);
      bp.dq = dq.data() + 2, bp.dk = dk.data(), bp.dv = dv.data(), bp.dlam = dlam.data();
      kernels::attention_bwd(bp, be);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < Tq; ++t)
          for (int64_t x = 0; x < qrow; ++x) {
            const float got = dq[(b * Tq + t) * qrow + x];
            if (x < 2 || x >= 2 + 2 * H * D) EXPECT_EQ(got, -3.0f);
            else EXPECT_EQ(got, want_g.dq[(b * Tq + t) * 2 * H * D + x - 2]);
          }
        for (int64_t t = 0; t < Tcap; ++t) {
          for (int64_t x = 0; x < krow; ++x) {
            const float got = dk[(b * Tcap + t) * krow + x];
            if (t >= Tk || x >= 2 * G * D) EXPECT_EQ(got, -3.0f);
            else EXPECT_EQ(got, want_g.dk[(b * Tk + t) * 2 * G * D + x]);
          }
          for (int64_t x = 0; x < vrow; ++x) {
            const float got = dv[(b * Tcap + t) * vrow + x];
            if (t >= Tk || x >= G * Dv) EXPECT_EQ(got, -3.0f);
            else EXPECT_EQ(got, want_g.dv[(b * Tk + t) * G * Dv + x]);
          }
        }
      }
      EXPECT_EQ(dlam, want_g.dlam);
    }

    // Decode on the same cache: the newest 2 query rows against the whole cache, through the
    // views, against the reference on the same views.
    kernels::AttnParams pd = p;
    pd.Tq = 2;
    pd.o_batch_stride = 2 * orow;
    std::vector<float> ref_out(B * 2 * orow, 0.0f), ref_lse(B * 2 * H * 2), got_out = ref_out,
        got_lse = ref_lse;
    pd.out = ref_out.data(), pd.lse = ref_lse.data(), pd.o2 = nullptr;
    kernels::attention_fwd(pd, kernels::Backend::Reference);
    pd.out = got_out.data(), pd.lse = got_lse.data();
    kernels::AttnDecodeParams dp(pd);
    dp.key_chunk = 64;
    kernels::attention_decode(dp);
    Problem pq = pr;  // the naive float32 error of the same rows, for the tolerance
    pq.Tq = 2;
    pq.q.resize(B * 2 * 2 * H * D);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(&pr.q[b * Tq * 2 * H * D], 2 * 2 * H * D, &pq.q[b * 2 * 2 * H * D]);
    std::vector<float> naive = bench::naive_fwd(pq.params()), naive_buf(ref_out.size(), 0.0f);
    for (int64_t bt = 0; bt < B * 2; ++bt) std::copy_n(&naive[bt * H * Dv], H * Dv, &naive_buf[bt * orow]);
    expect_close("decode out", got_out, ref_out, naive_buf);
    expect_lse_close(got_lse, ref_lse);
  }
}

// ---- one lambda for every pair (lam (1), a V1 layer's scalar) ----

TEST(FusedScalarLambda, EqualsTheBroadcastLambdaAndItsGradientIsOneSum) {
  for (kernels::Backend be : {kernels::Backend::Fused, kernels::Backend::Reference}) {
    SCOPED_TRACE(kernels::backend_name(be));
    Problem pr = problem_of(AttnCase{"", 2, 2, 37, 37, 4, 2, 8, 16, false, false, true}, 61);
    Problem one = pr;
    one.lam_scalar = true;
    one.lam = {0.37f};
    pr.lam.assign(4, 0.37f);
    ASSERT_TRUE(one.params().lam_scalar);
    const testing::FwdResult a = testing::run_fwd(one, be), b = testing::run_fwd(pr, be);
    EXPECT_EQ(a.out, b.out);  // the same arithmetic, lambda read once per pair
    EXPECT_EQ(a.o2, b.o2);
    const std::vector<float> dout = bench::randn(a.out.size(), 62);
    const testing::BwdResult ga = testing::run_bwd(one, dout, be), gb = testing::run_bwd(pr, dout, be);
    EXPECT_EQ(ga.dq, gb.dq);
    EXPECT_EQ(ga.dk, gb.dk);
    EXPECT_EQ(ga.dv, gb.dv);
    ASSERT_EQ(ga.dlam.size(), 1u);
    double sum = 0, mag = 0;  // the per-pair gradients' sum, and the size of its terms
    for (float x : gb.dlam) sum += x, mag += std::abs(x);
    EXPECT_NEAR(ga.dlam[0], sum, 4 * 6e-8 * mag);
  }
  // The two backends agree on the one sum.
  Problem one = problem_of(AttnCase{"", 2, 2, 37, 37, 4, 2, 8, 16, false, false, true}, 61);
  one.lam_scalar = true;
  one.lam = {0.37f};
  const testing::FwdResult f = testing::run_fwd(one, kernels::Backend::Reference);
  const std::vector<float> dout = bench::randn(f.out.size(), 62);
  const float fused = testing::run_bwd(one, dout, kernels::Backend::Fused).dlam[0];
  const float ref = testing::run_bwd(one, dout, kernels::Backend::Reference).dlam[0];
  EXPECT_NEAR(fused, ref, 1e-5 * (1 + std::abs(ref)));
}

// ---- grouped differential attention: one noise map for noise_share pairs ----

// q's map-2 rows of every pair replaced by those of the first pair of its run of ns.
void copy_noise_rows(Problem& pr, int64_t ns) {
  const int64_t nh = 2 * pr.H;
  for (int64_t bt = 0; bt < pr.B * pr.Tq; ++bt) {
    for (int64_t h = 0; h < pr.H; ++h) {
      const int64_t lead = h - h % ns;
      std::copy_n(&pr.q[static_cast<size_t>((bt * nh + 2 * lead + 1) * pr.D)], pr.D,
                  &pr.q[static_cast<size_t>((bt * nh + 2 * h + 1) * pr.D)]);
    }
  }
}

TEST(FusedNoiseShare, OneNoiseMapPerRunEqualsThePerPairMapsAndReadsTheRunsFirstPair) {
  // The tiled forward and the split-KV decode against the reference on equal copies, and, with
  // other rows in the copies' place, still the same result (only each run's first pair is read)
  // where the reference (each pair's own) moves.
  // (Tq, Tk): a prompt, a chunk after a cached prefix, one row
  for (auto [Tq, Tk] : {std::pair<int64_t, int64_t>{37, 37}, {9, 300}, {1, 70}}) {
    for (int64_t ns : {2, 4}) {
      SCOPED_TRACE("Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk) + " ns " + std::to_string(ns));
      Problem pr;
      pr.B = 2, pr.Tq = Tq, pr.Tk = Tk, pr.H = 8, pr.G = 2, pr.D = 8, pr.Dv = 16, pr.causal = true;
      pr.randomize(71);
      copy_noise_rows(pr, ns);
      const testing::FwdResult ref = testing::run_fwd(pr, kernels::Backend::Reference);
      Problem sh = pr;
      sh.noise_share = ns;
      const testing::FwdResult got = testing::run_fwd(sh, kernels::Backend::Fused);
      const double tol = 1e-5 * (1 + max_abs(ref.out));
      EXPECT_LE(max_diff(got.out, ref.out), tol);
      EXPECT_LE(max_diff(got.o2, ref.o2), tol);
      for (size_t i = 0; i < ref.lse.size(); ++i) ASSERT_NEAR(got.lse[i], ref.lse[i], 1e-5 * (1 + std::abs(ref.lse[i])));
      // Other rows in the copies' place: the fused forward reads only each run's first pair
      // (unchanged result), the reference each pair's own (a different one).
      Problem odd = sh;
      const std::vector<float> noise = bench::randn(static_cast<int64_t>(odd.q.size()), 72);
      for (int64_t bt = 0; bt < odd.B * odd.Tq; ++bt) {
        for (int64_t h = 0; h < odd.H; ++h) {
          if (h % ns == 0) continue;
          for (int64_t d = 0; d < odd.D; ++d) {
            const size_t i = static_cast<size_t>((bt * 2 * odd.H + 2 * h + 1) * odd.D + d);
            odd.q[i] = noise[i];
          }
        }
      }
      const testing::FwdResult moved = testing::run_fwd(odd, kernels::Backend::Fused);
      EXPECT_LE(max_diff(moved.out, got.out), tol);
      EXPECT_GT(max_diff(testing::run_fwd(odd, kernels::Backend::Reference).out, ref.out), 100 * tol);
      // The split-KV decode (explicit entry, many splits) shares the map the same way.
      if (Tq <= 9) {
        for (const Problem* in : {&sh, &odd}) {
          kernels::AttnDecodeParams dp(in->params());
          dp.key_chunk = 64;
          testing::FwdResult dec = ref;
          std::fill(dec.out.begin(), dec.out.end(), NAN);
          std::fill(dec.o2.begin(), dec.o2.end(), NAN);
          std::fill(dec.lse.begin(), dec.lse.end(), NAN);
          dp.out = dec.out.data(), dp.o2 = dec.o2.data(), dp.lse = dec.lse.data();
          kernels::attention_decode(dp);
          EXPECT_LE(max_diff(dec.out, ref.out), tol);
          EXPECT_LE(max_diff(dec.o2, ref.o2), tol);
          for (size_t i = 0; i < ref.lse.size(); ++i) ASSERT_NEAR(dec.lse[i], ref.lse[i], 1e-5 * (1 + std::abs(ref.lse[i])));
        }
      }
    }
  }
  Problem bad;
  bad.H = 8, bad.G = 2;
  bad.randomize(3);
  bad.noise_share = 3;  // does not divide the 4 pairs of a group
  EXPECT_THROW(testing::run_fwd(bad, kernels::Backend::Fused), InvalidArgument);
}

// ---- numerical edge cases ----

TEST(FusedEdgeCases, HugeLogits) {
  Problem pr = problem_of(AttnCase{"", 2, 1, 40, 40, 2, 1, 8, 16, false, true, true, -0.5f, 1.5f}, 51);
  for (float& x : pr.q) x *= 4e3f;  // scores around +-1e4
  const testing::FwdResult ref = testing::run_fwd(pr, kernels::Backend::Reference);
  const testing::FwdResult got = testing::run_fwd(pr, kernels::Backend::Fused);
  ASSERT_TRUE(testing::all_finite(got.out) && testing::all_finite(got.lse));
  expect_close("out", got.out, ref.out, bench::naive_fwd(pr.params()));
  const testing::BwdResult g =
      testing::run_bwd(pr, bench::randn(ref.out.size(), 3), kernels::Backend::Fused);
  EXPECT_TRUE(testing::all_finite(g.dq) && testing::all_finite(g.dk) &&
              testing::all_finite(g.dv) && testing::all_finite(g.dlam));
}

TEST(FusedEdgeCases, RowsThatSeeNoKeyAreZero) {
  // Causal with Tq > Tk: rows 0..Tq-Tk-1 see no key: out 0, lse +inf, gradients 0.
  for (int64_t Tk : {3, 300}) {
    Problem pr = problem_of(AttnCase{"", 2, 1, Tk + 5, Tk, 1, 1, 4, 8, false, false, true}, 52);
    const testing::FwdResult got = testing::run_fwd(pr, kernels::Backend::Fused);
    for (int64_t i = 0; i < 5; ++i) {
      for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(got.out[i * 8 + d], 0.0f);
      EXPECT_TRUE(std::isinf(got.lse[i]) && got.lse[i] > 0);
    }
    const testing::BwdResult g =
        testing::run_bwd(pr, bench::randn(got.out.size(), 4), kernels::Backend::Fused);
    for (int64_t x = 0; x < 5 * 2 * 4; ++x) EXPECT_EQ(g.dq[x], 0.0f);
    check_forward(pr, "masked rows");
  }
}

TEST(FusedEdgeCases, ClampRowThatClampsToAllZerosStaysZero) {
  Problem pr = problem_of(AttnCase{"", 2, 1, 30, 30, 1, 1, 3, 6, false, false, false}, 53);
  pr.mode = kernels::DiffMode::Clamp;
  for (int64_t t = 0; t < 30; ++t) {
    for (int64_t d = 0; d < 3; ++d) {
      pr.q[t * 6 + 3 + d] = pr.q[t * 6 + d];
      pr.k[t * 6 + 3 + d] = pr.k[t * 6 + d];
    }
  }
  pr.lam = {1.5f};
  const testing::FwdResult got = testing::run_fwd(pr, kernels::Backend::Fused);
  for (float x : got.out) EXPECT_EQ(x, 0.0f);
}

TEST(FusedEdgeCases, EmptyShapes) {
  Problem pr = problem_of(AttnCase{"", 2, 0, 5, 5, 1, 1, 4, 8, false, false, false}, 54);
  EXPECT_TRUE(testing::run_fwd(pr, kernels::Backend::Fused).out.empty());
  pr = problem_of(AttnCase{"", 2, 1, 0, 5, 1, 1, 4, 8, false, false, false}, 54);
  EXPECT_TRUE(testing::run_fwd(pr, kernels::Backend::Fused).out.empty());
  pr = problem_of(AttnCase{"", 2, 1, 3, 0, 1, 1, 4, 8, false, false, false}, 54);
  const testing::FwdResult f = testing::run_fwd(pr, kernels::Backend::Fused);
  for (float x : f.out) EXPECT_EQ(x, 0.0f);
}

TEST(FusedDispatch, BackendNamesAndSimdTarget) {
  EXPECT_EQ(kernels::resolve_backend(kernels::Backend::Reference), kernels::Backend::Reference);
  EXPECT_EQ(kernels::resolve_backend(kernels::Backend::Fused), kernels::Backend::Fused);
  const std::string target = kernels::fused_simd_target();
  EXPECT_FALSE(target.empty());
}

// ---- the case itself: what `diffattn bench` reports and the rules the tests above use ----

AttnCase catalogue_case(const std::vector<AttnCase>& cases, const std::string& name) {
  for (const AttnCase& c : cases) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no case " << name << " in the catalogue";
  return cases.front();
}

TEST(AttnCase, FlopsAndBytesAreTheKernelsCounts) {
  // The default V1 row of `diffattn bench`: causal, 4096 x 4096, 4 pairs of D=64, Dv=128.
  const AttnCase c{"v1", 2, 1, 4096, 4096, 4, 4, 64, 128, false, false, true};
  const double pairs = 4096.0 * 4097.0 / 2;  // query i sees keys 0..i
  EXPECT_DOUBLE_EQ(c.fwd_flops(), pairs * 4 * 2 * 2 * (64 + 128));
  EXPECT_DOUBLE_EQ(c.bwd_flops(), 2.5 * c.fwd_flops());
  const bench::Tensors t(c, 1, /*with_grads=*/false);
  EXPECT_DOUBLE_EQ(c.fwd_flops(), kernels::attention_fwd_flops(t.p));
  EXPECT_EQ(c.str(), "B=1 H=4 G=4 Tq=4096 Tk=4096 D=64 Dv=128 V1");
  // Decode: K (2G heads of D) and V (G heads of Dv) once, 4 bytes each; half in 16 bits.
  AttnCase d = c.with_lengths(1, 32768);
  EXPECT_DOUBLE_EQ(d.kv_bytes(), 4.0 * 32768 * (8 * 64 + 4 * 128));
  d.kv_dtype = DType::BF16;
  EXPECT_DOUBLE_EQ(d.kv_bytes(), 2.0 * 32768 * (8 * 64 + 4 * 128));
  // The peers: standard of equal parameters (2H heads of D, 2G groups) and V2 of that size.
  const AttnCase s = bench::standard_equivalent(c), v2 = bench::v2_equivalent(c);
  EXPECT_EQ(s.str(), "B=1 H=8 G=8 Tq=4096 Tk=4096 D=64 Dv=64");
  EXPECT_EQ(v2.str(), "B=1 H=8 G=8 Tq=4096 Tk=4096 D=64 Dv=64 V2");
  EXPECT_DOUBLE_EQ(v2.fwd_flops(), 2 * s.fwd_flops());
  EXPECT_DOUBLE_EQ(v2.with_lengths(1, 100).kv_bytes(), s.with_lengths(1, 100).kv_bytes());
}

TEST(AttnCase, SeededInputsRepeatAndLambdaStaysInItsRange) {
  const AttnCase c = catalogue_case(bench::fused_test_cases(), "lambda_outside_unit");  // [-0.9, 1.8]
  const bench::CaseInputs a = bench::make_inputs(c, 5), b = bench::make_inputs(c, 5),
                          other = bench::make_inputs(c, 6);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.lam, b.lam);
  EXPECT_NE(a.q, other.q);
  ASSERT_EQ(a.lam.size(), static_cast<size_t>(c.B * c.Tq * c.H));
  bool below0 = false, above1 = false;
  for (float x : a.lam) {
    EXPECT_TRUE(x >= -0.9f && x <= 1.8f) << x;
    below0 |= x < 0, above1 |= x > 1;
  }
  EXPECT_TRUE(below0 && above1);
}

TEST(AttnCase, RulesRejectWhatTheyShould) {
  const std::vector<float> truth{1.0f, -2.0f, 0.5f}, naive{1.0f + 1e-6f, -2.0f, 0.5f};
  // bound = 8 * 1e-6 (naive error, as float) + 32 eps * 2 (scale)
  const double bound = 8.0 * std::abs(static_cast<double>(naive[0]) - 1.0) + 32 * bench::kEps32 * 2;
  EXPECT_TRUE(bench::compare("x", truth, truth, naive).ok());
  bench::Comparison inside = bench::compare("x", {1.0f, -2.0f, 0.5f + 7e-6f}, truth, naive);
  EXPECT_TRUE(inside.ok()) << inside.str();
  EXPECT_DOUBLE_EQ(inside.bound, bound);
  EXPECT_EQ(inside.worst, 2);
  EXPECT_FALSE(bench::compare("x", {1.0f, -2.0f, 0.5f + 2e-5f}, truth, naive).ok());
  EXPECT_FALSE(bench::compare("x", {NAN, -2.0f, 0.5f}, truth, naive).ok());
  EXPECT_FALSE(bench::compare("x", {1.0f, -2.0f}, truth, naive).ok());  // sizes differ
  // The scale floor widens the bound where the values cancel.
  EXPECT_FALSE(bench::compare("x", {1e-6f}, {0.0f}, {0.0f}).ok());
  EXPECT_TRUE(bench::compare("x", {1e-6f}, {0.0f}, {0.0f}, 1000.0).ok());
  // lse: +inf exactly where the reference has it; otherwise 64 eps (1 + |lse|).
  const std::vector<float> lse{INFINITY, 3.0f};
  EXPECT_TRUE(bench::compare_lse(lse, lse).ok());
  EXPECT_FALSE(bench::compare_lse({3.0f, 3.0f}, lse).ok());
  EXPECT_FALSE(bench::compare_lse({INFINITY, INFINITY}, lse).ok());
  EXPECT_FALSE(bench::compare_lse({INFINITY, 3.0f + 1e-4f}, lse).ok());
  EXPECT_EQ(bench::compare_lse({INFINITY, NAN}, lse).failures, 1);
  // 16 bits: 2x the plain computation's error; a rounding that changed nothing is vacuous.
  EXPECT_TRUE(bench::compare_dtype("x", {1.01f}, {1.0f}, {1.01f}).ok());
  EXPECT_FALSE(bench::compare_dtype("x", {1.03f}, {1.0f}, {1.01f}).ok());
  EXPECT_FALSE(bench::compare_dtype("x", {1.0f}, {1.0f}, {1.0f}).ok());
}

TEST(AttnCase, CheckCaseCatchesAWrongResult) {
  // check_case runs what `diffattn bench --check` runs: on a good kernel every tensor passes,
  // and the same comparison on a result nudged by 1e-3 fails.
  const AttnCase c = catalogue_case(bench::fused_test_cases(), "t97_v1_causal");
  for (const bench::Comparison& x : bench::check_case(c, 1, /*backward=*/true)) {
    EXPECT_TRUE(x.ok()) << x.str();
  }
  AttnCase c16 = catalogue_case(bench::cache16_test_cases(), "v1_tq3_gqa");
  c16.kv_dtype = DType::F16;
  const std::vector<bench::Comparison> r16 = bench::check_case(c16, 1, false);
  ASSERT_EQ(r16.size(), 4u);  // out vs float64, out, lse, o2
  for (const bench::Comparison& x : r16) EXPECT_TRUE(x.ok()) << x.str();
  Problem pr = problem_of(c, 1);
  const testing::FwdResult ref = testing::run_fwd(pr, kernels::Backend::Reference);
  std::vector<float> wrong = testing::run_fwd(pr, kernels::Backend::Fused).out;
  wrong[wrong.size() / 2] += 1e-3f;
  EXPECT_FALSE(bench::compare("out", wrong, ref.out, bench::naive_fwd(pr.params())).ok());
}

}  // namespace
}  // namespace diffattn
