// Attention cases shared by the fused tests and `diffattn bench`: see attn_case.h.
#include "bench/cases/attn_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "bench/cases/naive32.h"
#include "diffattn/base/error.h"
#include "diffattn/base/rng.h"

namespace diffattn::bench {

kernels::AttnProblem AttnCase::sizes() const {
  kernels::AttnProblem p;
  p.B = B, p.Tq = Tq, p.Tk = Tk, p.H = H, p.G = G, p.D = D, p.Dv = Dv;
  p.maps = maps;
  p.shared_keys = shared_keys;
  p.lam_per_token = lam_per_token;
  p.causal = causal;
  p.mode = mode;
  p.kv_dtype = kv_dtype;
  return p;
}

std::string AttnCase::str() const {
  std::ostringstream os;
  os << "B=" << B << " H=" << H << " G=" << G << " Tq=" << Tq << " Tk=" << Tk << " D=" << D
     << " Dv=" << Dv;
  if (maps == 2) os << (shared_keys ? " V2" : " V1");
  return os.str();
}

double AttnCase::fwd_flops() const { return kernels::attention_fwd_flops(sizes()); }

double AttnCase::k_bytes() const {
  const kernels::AttnProblem p = sizes();
  return static_cast<double>(dtype_size(kv_dtype)) * static_cast<double>(p.numel(p.k_shape()));
}

double AttnCase::v_bytes() const {
  const kernels::AttnProblem p = sizes();
  return static_cast<double>(dtype_size(kv_dtype)) * static_cast<double>(p.numel(p.v_shape()));
}

AttnCase AttnCase::with_lengths(int64_t tq, int64_t tk) const {
  AttnCase c = *this;
  c.Tq = tq;
  c.Tk = tk;
  return c;
}

AttnCase standard_equivalent(const AttnCase& d) {
  AttnCase s = d;
  s.maps = 1;
  s.H = 2 * d.H;
  s.G = 2 * d.G;
  s.Dv = d.D;
  s.shared_keys = s.lam_per_token = false;
  return s;
}

AttnCase v2_equivalent(const AttnCase& d) {
  AttnCase s = standard_equivalent(d);
  s.maps = 2;
  s.shared_keys = s.lam_per_token = true;
  return s;
}

std::vector<float> randn(int64_t n, uint32_t seed, float sd) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = static_cast<float>(sd * rng.normal());
  return x;
}

CaseInputs make_inputs(const AttnCase& c, uint32_t seed) {
  const kernels::AttnProblem p = c.sizes();
  CaseInputs in;
  in.q = randn(p.numel(p.q_shape()), seed);
  in.k = randn(p.numel(p.k_shape()), seed + 1);
  in.v = randn(p.numel(p.v_shape()), seed + 2);
  if (c.maps == 2) {
    Rng rng(seed + 3);
    in.lam.resize(static_cast<size_t>(p.numel(p.lam_shape())));
    for (float& x : in.lam) x = static_cast<float>(c.lam_lo + (c.lam_hi - c.lam_lo) * rng.uniform());
  }
  return in;
}

Kv16::Kv16(std::span<const float> k32, std::span<const float> v32, DType dt, bool keep_rounded)
    : dtype(dt), k(k32.size()), v(v32.size()) {
  if (dt != DType::BF16 && dt != DType::F16) {
    throw InvalidArgument(std::string("Kv16: the cache type is ") + dtype_name(dt) +
                          ", expected BF16 or F16");
  }
  convert_from_f32(k.data(), k32.data(), dt, static_cast<int64_t>(k.size()));
  convert_from_f32(v.data(), v32.data(), dt, static_cast<int64_t>(v.size()));
  if (!keep_rounded) return;
  k_rounded.resize(k.size());
  v_rounded.resize(v.size());
  convert_to_f32(k_rounded.data(), k.data(), dt, static_cast<int64_t>(k.size()));
  convert_to_f32(v_rounded.data(), v.data(), dt, static_cast<int64_t>(v.size()));
}

void Kv16::use_in(kernels::AttnProblem& p) const {
  p.kv_dtype = dtype;
  p.k = k.data();
  p.v = v.data();
}

namespace {

std::string fmt(double x) {
  std::ostringstream os;
  os.precision(3);
  os << x;
  return os.str();
}

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}

Comparison size_mismatch(const std::string& name, size_t got, size_t want) {
  Comparison c;
  c.name = name + " (" + std::to_string(got) + " values, expected " + std::to_string(want) + ")";
  c.err = std::numeric_limits<double>::infinity();
  c.failures = 1;
  return c;
}

}  // namespace

std::string Comparison::str() const {
  std::ostringstream os;
  os << name << ": ";
  if (per_entry) {  // the lse rule
    os << failures << " entries outside 64 eps (1 + |lse|) of the reference (worst: " << fmt(err)
       << " x the tolerance at [" << worst << "])";
    return os.str();
  }
  os << "max error " << fmt(err) << (ok() ? " <= " : " > ") << "bound " << fmt(bound)
     << " (naive error " << fmt(naive_err) << ", scale " << fmt(scale) << ", worst at [" << worst
     << "])";
  return os.str();
}

Comparison compare(const std::string& name, const std::vector<float>& got,
                   const std::vector<float>& truth, const std::vector<float>& naive,
                   double scale_floor) {
  if (got.size() != truth.size()) return size_mismatch(name, got.size(), truth.size());
  if (naive.size() != truth.size()) return size_mismatch(name + " naive", naive.size(), truth.size());
  Comparison c;
  c.name = name;
  c.scale = scale_floor;
  int64_t nans = 0;
  for (size_t i = 0; i < truth.size(); ++i) {
    const double t = truth[i], e = std::abs(static_cast<double>(got[i]) - t);
    c.scale = std::max(c.scale, std::abs(t));
    if (std::isnan(e)) {
      if (nans++ == 0) c.worst = static_cast<int64_t>(i);
    } else if (nans == 0 && (e > c.err || c.worst < 0)) {
      c.err = e, c.worst = static_cast<int64_t>(i);
    }
    c.naive_err = std::max(c.naive_err, std::abs(static_cast<double>(naive[i]) - t));
  }
  if (nans > 0) c.err = NAN;
  c.bound = fused_bound(c.naive_err, c.scale);
  c.failures = c.err <= c.bound ? 0 : 1;  // NaN: a failure
  return c;
}

Comparison compare_dtype(const std::string& name, const std::vector<float>& got,
                         const std::vector<float>& truth64, const std::vector<float>& plain) {
  Comparison c = compare(name, got, truth64, plain);
  c.scale = std::max(1e-30, max_abs(truth64));
  c.bound = dtype_bound(c.naive_err, c.scale);
  c.failures = (c.err <= c.bound ? 0 : 1) + (c.naive_err > 0.0 ? 0 : 1);
  if (!(c.naive_err > 0.0)) c.name += " (rounding K/V changed nothing: a vacuous check)";
  return c;
}

Comparison compare_lse(const std::vector<float>& got, const std::vector<float>& truth) {
  if (got.size() != truth.size()) return size_mismatch("lse", got.size(), truth.size());
  Comparison c;
  c.name = "lse";
  c.per_entry = true;
  c.bound = 1.0;
  for (size_t i = 0; i < truth.size(); ++i) {
    bool ok = true;
    double ratio = 0;  // |got - truth| over the tolerance
    if (std::isinf(truth[i])) {
      ok = std::isinf(got[i]) && got[i] > 0;
      ratio = ok ? 0 : INFINITY;
    } else {
      const double e = std::abs(static_cast<double>(got[i]) - truth[i]), tol = lse_tolerance(truth[i]);
      ok = e <= tol;  // NaN: not ok
      ratio = std::isnan(e) ? INFINITY : e / tol;
    }
    if (!ok) ++c.failures;
    if (ratio > c.err || c.worst < 0) c.err = ratio, c.worst = static_cast<int64_t>(i);
  }
  return c;
}

namespace {

struct Fwd {
  std::vector<float> out, lse, o2;
};

// A forward of p (inputs as given) into fresh contiguous outputs.
Fwd run_fwd(const kernels::AttnParams& in, kernels::Backend backend) {
  kernels::AttnParams p = in;
  Fwd r;
  r.out.assign(static_cast<size_t>(p.numel(p.out_shape())), NAN);
  r.lse.assign(static_cast<size_t>(p.numel(p.lse_shape())), NAN);
  p.out = r.out.data();
  p.lse = r.lse.data();
  p.o2 = nullptr;
  if (p.maps == 2) {
    r.o2.assign(r.out.size(), NAN);
    p.o2 = r.o2.data();
  }
  kernels::attention_fwd(p, backend);
  return r;
}

// The checks read every tensor as contiguous: refuse a problem with other strides.
void require_contiguous(const kernels::AttnProblem& p, const char* what) {
  kernels::AttnProblem c = p;
  c.set_contiguous_strides();
  const bool same = c.q_batch_stride == p.q_batch_stride && c.q_row_stride == p.q_row_stride &&
                    c.q_head_stride == p.q_head_stride && c.k_batch_stride == p.k_batch_stride &&
                    c.k_row_stride == p.k_row_stride && c.k_head_stride == p.k_head_stride &&
                    c.v_batch_stride == p.v_batch_stride && c.v_row_stride == p.v_row_stride &&
                    c.v_head_stride == p.v_head_stride && c.o_batch_stride == p.o_batch_stride &&
                    c.o_row_stride == p.o_row_stride && c.o_head_stride == p.o_head_stride;
  if (!same) {
    throw InvalidArgument(std::string(what) +
                          ": the case's tensors must be contiguous (strided views are tested "
                          "against contiguous copies instead)");
  }
}

}  // namespace

std::vector<Comparison> check_fwd(const kernels::AttnParams& p, kernels::Backend fused, const kernels::AttnProblem* p32) {
  require_contiguous(p, "check_fwd");
  // The float32 problem on the values the kernels read (K/V rounded when stored in 16 bits).
  kernels::AttnParams pr = p;
  std::vector<float> kr, vr;
  if (p.kv_dtype != DType::F32) {
    kr.resize(static_cast<size_t>(p.numel(p.k_shape())));
    vr.resize(static_cast<size_t>(p.numel(p.v_shape())));
    convert_to_f32(kr.data(), p.k, p.kv_dtype, static_cast<int64_t>(kr.size()));
    convert_to_f32(vr.data(), p.v, p.kv_dtype, static_cast<int64_t>(vr.size()));
    pr.kv_dtype = DType::F32;
    pr.k = kr.data();
    pr.v = vr.data();
  }
  const Fwd got = run_fwd(p, fused);
  const Fwd ref = run_fwd(pr, kernels::Backend::Reference);
  const std::vector<float> naive = naive_fwd(pr);
  std::vector<Comparison> r;
  if (p.kv_dtype != DType::F32 && p32 != nullptr) {
    kernels::AttnParams p64 = p;
    static_cast<kernels::AttnProblem&>(p64) = *p32;
    const Fwd truth64 = run_fwd(p64, kernels::Backend::Reference);
    r.push_back(compare_dtype("out vs float64 on unrounded K/V", got.out, truth64.out, naive));
  }
  r.push_back(compare("out", got.out, ref.out, naive));
  r.push_back(compare_lse(got.lse, ref.lse));
  if (p.maps == 2) r.push_back(compare("o2", got.o2, ref.o2, naive));
  return r;
}

std::vector<Comparison> check_bwd(const kernels::AttnParams& in, const std::vector<float>& dout,
                                  kernels::Backend fused) {
  require_contiguous(in, "check_bwd");
  if (static_cast<int64_t>(dout.size()) != in.numel(in.out_shape())) {
    throw InvalidArgument("check_bwd: dout has " + std::to_string(dout.size()) +
                          " values, expected " + std::to_string(in.numel(in.out_shape())));
  }
  struct Grads {
    std::vector<float> dq, dk, dv, dlam;
  };
  auto run = [&](kernels::Backend backend) {
    const Fwd f = run_fwd(in, backend);
    kernels::AttnBwdParams p(in);
    p.out = f.out.data();
    p.lse = f.lse.data();
    p.o2 = in.maps == 2 ? f.o2.data() : nullptr;
    p.dout = dout.data();
    Grads g;
    g.dq.assign(static_cast<size_t>(in.numel(in.q_shape())), NAN);
    g.dk.assign(static_cast<size_t>(in.numel(in.k_shape())), NAN);
    g.dv.assign(static_cast<size_t>(in.numel(in.v_shape())), NAN);
    p.dq = g.dq.data(), p.dk = g.dk.data(), p.dv = g.dv.data(), p.dlam = nullptr;
    if (in.maps == 2) {
      g.dlam.assign(static_cast<size_t>(in.numel(in.lam_shape())), NAN);
      p.dlam = g.dlam.data();
    }
    // The reference side is the oracle: it recomputes the maps, so the comparison also checks
    // the lse, out and o2 the forward saved (Backend::Reference's backward honours them).
    if (backend == kernels::Backend::Reference) {
      kernels::attention_bwd_oracle(p);
    } else {
      kernels::attention_bwd(p, backend);
    }
    return g;
  };
  const Grads ref = run(kernels::Backend::Reference), got = run(fused);
  const NaiveGrads naive = naive_bwd(in, dout.data());
  // Gradients are sums of terms of the size of the largest gradient entry; dq and dk of a row
  // with one visible key cancel exactly in exact arithmetic, not in float.
  const double terms = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  std::vector<Comparison> r;
  r.push_back(compare("dq", got.dq, ref.dq, naive.dq, terms));
  r.push_back(compare("dk", got.dk, ref.dk, naive.dk, terms));
  r.push_back(compare("dv", got.dv, ref.dv, naive.dv, terms));
  if (in.maps == 2) r.push_back(compare("dlam", got.dlam, ref.dlam, naive.dlam, terms));
  return r;
}

std::vector<Comparison> check_case(const AttnCase& c, uint32_t seed, bool backward) {
  AttnCase c32 = c;
  c32.kv_dtype = DType::F32;
  const CaseInputs in = make_inputs(c32, seed);
  const kernels::AttnProblem sz = c32.sizes();
  kernels::AttnOptions o;
  o.causal = c.causal;
  o.mode = c.mode;
  kernels::AttnParams p = c.maps == 2 ? kernels::diff_attn_params({in.q.data(), sz.q_shape()}, {in.k.data(), sz.k_shape()},
                                                {in.v.data(), sz.v_shape()},
                                                {in.lam.data(), sz.lam_shape()}, o)
                             : kernels::attn_params({in.q.data(), sz.q_shape()}, {in.k.data(), sz.k_shape()},
                                           {in.v.data(), sz.v_shape()}, o);
  if (c.kv_dtype != DType::F32) {
    if (backward) throw InvalidArgument("check_case: the backward takes no 16-bit K/V (" + c.name + ")");
    const Kv16 kv(in.k, in.v, c.kv_dtype);
    kernels::AttnParams p16 = p;
    kv.use_in(p16);
    return check_fwd(p16, kernels::Backend::Fused, &p);
  }
  std::vector<Comparison> r = check_fwd(p);
  if (backward) {
    const std::vector<Comparison> g = check_bwd(p, randn(sz.numel(sz.out_shape()), seed + 4));
    r.insert(r.end(), g.begin(), g.end());
  }
  return r;
}

const std::vector<AttnCase>& fused_test_cases() {
  // name, maps, B, Tq, Tk, H, G, D, Dv, shared keys (V2), lambda per token, causal[, lam range]
  static const std::vector<AttnCase> cases{
      {"t1", 2, 1, 1, 1, 1, 1, 8, 16, false, false, false},
      {"t2_causal", 2, 1, 2, 2, 1, 1, 3, 6, true, false, true},
      {"t97_v1_causal", 2, 1, 97, 97, 2, 1, 16, 32, false, false, true},
      {"t97_v2_token_lam", 2, 2, 97, 97, 2, 2, 8, 8, true, true, false},
      {"t1025_causal", 2, 1, 1025, 1025, 1, 1, 8, 16, false, false, true},
      {"odd_d", 2, 1, 37, 37, 2, 1, 5, 7, false, true, true},
      {"tq_lt_tk_causal", 2, 1, 21, 150, 2, 1, 8, 16, false, false, true},
      {"tq_gt_tk_causal", 2, 1, 150, 21, 2, 2, 8, 8, true, true, true},
      {"tq_ne_tk", 2, 2, 7, 70, 3, 1, 4, 8, false, true, false},
      {"gqa_4_pairs_1_group", 2, 1, 70, 70, 4, 1, 16, 32, false, false, true},
      {"gqa_v2", 2, 1, 45, 45, 4, 2, 8, 8, true, true, true},
      {"lambda_outside_unit", 2, 1, 40, 40, 2, 2, 8, 16, false, true, false, -0.9f, 1.8f},
      {"standard", 1, 2, 70, 70, 4, 4, 16, 16, false, false, false},
      {"standard_causal_gqa", 1, 1, 97, 97, 4, 1, 8, 12, false, false, true},
      // big enough for the work-per-thread bound to give them two threads
      {"t300_gqa_two_threads", 2, 2, 300, 300, 4, 2, 16, 32, false, true, true},
      {"decode_two_threads", 2, 1, 1, 12000, 2, 1, 16, 32, false, false, true},
      {"decode_v1", 2, 2, 1, 700, 2, 1, 16, 32, false, false, true},
      {"decode_v2_tq3", 2, 1, 3, 600, 4, 2, 8, 8, true, true, true},
      {"decode_standard_tq3", 1, 1, 3, 300, 4, 2, 8, 8, false, false, false},
  };
  return cases;
}

const std::vector<AttnCase>& cache16_test_cases() {
  // name, maps, B, Tq, Tk, H, G, D, Dv, shared keys (V2), lambda per token, causal
  static const std::vector<AttnCase> cases{
      {"v1", 2, 2, 1, 777, 2, 1, 16, 32, false, false, true},
      {"v1_tq3_gqa", 2, 1, 3, 301, 4, 2, 16, 32, false, false, true},
      {"v2_tq3", 2, 1, 3, 613, 4, 2, 8, 8, true, true, true},
      {"v2_not_causal", 2, 2, 1, 515, 2, 2, 16, 16, true, true, false},
      {"standard_gqa", 1, 1, 1, 999, 4, 1, 16, 16, false, false, true},
      {"standard_tq3", 1, 2, 3, 257, 2, 2, 8, 8, false, false, false},
      {"odd_dims", 2, 1, 3, 389, 2, 1, 5, 7, false, false, true},
      {"two_threads", 2, 1, 1, 12001, 2, 1, 16, 32, false, false, true},
      {"short_cache", 2, 1, 3, 37, 2, 1, 8, 16, false, false, true},  // decode path below 256
      {"prefill_tiled", 2, 1, 40, 40, 2, 1, 8, 16, false, false, true},
  };
  return cases;
}

}  // namespace diffattn::bench
