// One attention case, the unit that the fused kernels' tests check and `diffattn bench` times
// (as ggml's test_case drives its test and perf modes): the shape and options of one call of the
// operator family, what it costs (FLOPs as FlashAttention counts them, K/V bytes a decode
// reads), its seeded inputs, and the accuracy rule a fused result must meet against the
// reference. The catalogues at the end are the shapes tests/cpp/test_fused.cpp runs.
#pragma once

#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/base/memory.h"
#include "diffattn/kernels/attention.h"

namespace diffattn::bench {

struct AttnCase {
  std::string name;
  int maps = 2;  // 2: differential, 1: standard
  // H: differential pairs (or heads when maps == 1); G: key/value groups; D: query/key head
  // size; Dv: value head size.
  int64_t B = 1, Tq = 1, Tk = 1, H = 1, G = 1, D = 64, Dv = 128;
  bool shared_keys = false;    // V2: k has G heads read by both maps
  bool lam_per_token = false;  // lam (B, Tq, H) instead of (H)
  bool causal = false;
  float lam_lo = 0.1f, lam_hi = 0.9f;  // lambda drawn uniform in [lam_lo, lam_hi]
  kernels::DiffMode mode = kernels::DiffMode::Signed;
  DType kv_dtype = DType::F32;  // K/V stored as BF16/F16 (a 16-bit KV cache): forward only

  // The sizes and options as the kernels see them (no tensors): shapes, heads, causal mask.
  kernels::AttnProblem sizes() const;
  // "B=1 H=4 G=4 Tq=4096 Tk=4096 D=64 Dv=128 V1" (V1/V2 for differential cases).
  std::string str() const;

  // FLOPs of one forward as FlashAttention counts them (attention_fwd_flops: per visible
  // (query, key) pair and map, a D-long dot product and a Dv-long axpy); the backward 2.5x.
  double fwd_flops() const;
  double bwd_flops() const { return 2.5 * fwd_flops(); }
  // Bytes of K (resp. V) one forward reads, each cache row once, at kv_dtype's width; a decode
  // (one query row against Tk keys) is bound by kv_bytes() = k_bytes() + v_bytes().
  double k_bytes() const;
  double v_bytes() const;
  double kv_bytes() const { return k_bytes() + v_bytes(); }

  // The same case at other lengths (a prefill/training row at T: with_lengths(T, T); a
  // decode step against Tk cached keys: with_lengths(1, Tk)).
  AttnCase with_lengths(int64_t tq, int64_t tk) const;
};

// The standard attention of equal parameters: 2H heads of size D (values of size D), keys
// and values with 2G heads.
AttnCase standard_equivalent(const AttnCase& diff);
// DIFF V2 of the same model size as that standard peer: its 2H heads become 2H output heads of
// 4H query heads (two maps each), keys and values keep the standard's 2G heads of size D and
// are shared by both maps, lambda per token. Twice the standard's FLOPs, the same cache bytes.
AttnCase v2_equivalent(const AttnCase& diff);

// n floats drawn N(0, sd) from diffattn::Rng(seed) (the same on every standard library).
std::vector<float> randn(int64_t n, uint32_t seed, float sd = 1.0f);

// The seeded inputs of a case, contiguous in the shapes of AttnProblem: q, k, v ~ N(0, 1)
// (seeds seed, seed + 1, seed + 2) and lam uniform in [lam_lo, lam_hi] (seed + 3).
struct CaseInputs {
  std::vector<float> q, k, v, lam;
};
CaseInputs make_inputs(const AttnCase& c, uint32_t seed);

// K and V rounded to a 16-bit type (a BF16 or F16 KV cache), and (keep_rounded) the same
// values as float32.
struct Kv16 {
  DType dtype;
  PageVector<uint16_t> k;  // placed as a model's KV cache (base/memory.h)
  PageVector<uint16_t, kValuePageOffset> v;
  std::vector<float> k_rounded, v_rounded;
  Kv16(std::span<const float> k32, std::span<const float> v32, DType dt,
       bool keep_rounded = true);
  // Points p's K/V at the 16-bit copies (kv_dtype, k, v). Contiguous, as
  // the vectors given to the constructor were.
  void use_in(kernels::AttnProblem& p) const;
};

// ---- the accuracy rules (the fused tests and `diffattn bench --check`) ----
//
// A fused float32 result is compared with the reference (float64 accumulation) and must be at
// most 8 times as wrong as a naive float32 computation of the same case (naive32.h: both maps
// materialised in float, the chain rule in float), plus 32 float32 epsilons of the values'
// size: bound = 8 naive_err + 32 eps scale, with err, naive_err the largest absolute errors
// over the tensor and scale its largest |value| (or the size of the terms the values are sums
// of, where the values may cancel to 0). The saved log-sum-exp is a log: each entry within
// 64 eps (1 + |lse|) of the reference's, +inf exactly where the reference has +inf. With K/V
// stored in 16 bits (FlashAttention's rule), against float64 on the unrounded inputs: at most
// 2 times as wrong as a plain computation in that dtype (K/V rounded, naive float32
// arithmetic), plus 32 eps of the values' size.
inline constexpr double kEps32 = 1.1920928955078125e-07;
inline double fused_bound(double naive_err, double scale) {
  return 8.0 * naive_err + 32.0 * kEps32 * scale;
}
inline double dtype_bound(double plain_err, double scale) {
  return 2.0 * plain_err + 32.0 * kEps32 * scale;
}
inline double lse_tolerance(double lse) { return 64.0 * kEps32 * (1.0 + (lse < 0 ? -lse : lse)); }

// One tensor of a result measured against the truth under one of the rules above.
struct Comparison {
  std::string name;
  double err = 0;        // largest |got - truth| (lse: the largest |got - truth| / tolerance)
  double bound = 0;      // what the rule allows (lse: 1)
  double naive_err = 0;  // largest |naive - truth| (or of the plain computation in the dtype)
  double scale = 0;      // the values' size in the rule
  int64_t worst = -1;    // index of the largest error
  int64_t failures = 0;  // entries (or, for a max rule, tensors) outside the rule; sizes that
                         // differ or NaN errors count as failures
  bool per_entry = false;  // the lse rule (entry by entry) rather than a max rule
  bool ok() const { return failures == 0; }
  std::string str() const;  // "out: max error 1e-6 <= bound 3e-6 (naive float32 error ...)"
};

// The fused rule: got against truth, naive the naive float32 computation of the same values.
// scale_floor: the size of the terms the values are made of, where the values may cancel to
// exactly 0 (the gradient of q with a single visible key).
Comparison compare(const std::string& name, const std::vector<float>& got,
                   const std::vector<float>& truth, const std::vector<float>& naive,
                   double scale_floor = 1e-30);
// The 16-bit rule: got and plain (K/V rounded, naive float32) against float64 on the
// unrounded inputs. A plain error of 0 means rounding changed nothing: a failure (vacuous).
Comparison compare_dtype(const std::string& name, const std::vector<float>& got,
                         const std::vector<float>& truth64, const std::vector<float>& plain);
// The lse rule, entry by entry.
Comparison compare_lse(const std::vector<float>& got, const std::vector<float>& truth);

// The fused forward of p (contiguous inputs, as the *_params builders lay them out; float32 or
// 16-bit K/V) against the reference: out, lse and (differential) o2 under the rules above.
// A case with 16-bit K/V is compared with the reference on the rounded values (float32 rule)
// and, when p32 (the same problem on the unrounded float32 K/V) is given, with float64 on the
// unrounded inputs (16-bit rule).
std::vector<Comparison> check_fwd(const kernels::AttnParams& p, kernels::Backend fused = kernels::Backend::Fused,
                                  const kernels::AttnProblem* p32 = nullptr);
// The fused backward (after its own forward) against the reference backward (after the
// reference forward), dout (B, Tq, H, Dv) contiguous: dq, dk, dv and (differential) dlam,
// each with the size of the largest gradient entry as its scale floor.
std::vector<Comparison> check_bwd(const kernels::AttnParams& p, const std::vector<float>& dout,
                                  kernels::Backend fused = kernels::Backend::Fused);
// A case end to end: its inputs at `seed`, the forward (and with `backward`, the backward on
// dout = randn(seed + 4)) checked as above.
std::vector<Comparison> check_case(const AttnCase& c, uint32_t seed, bool backward);

// ---- catalogues ----

// The shapes every parameterised fused test runs: T = 1, 2, 97, 1025; odd D and Dv; Tq < Tk
// and Tq > Tk, causal and not; GQA; V1, V2, lambda per token, lambda outside [0, 1];
// standard attention; shapes large enough for two threads; decode (Tq <= 4, Tk >= 256).
const std::vector<AttnCase>& fused_test_cases();
// Decode against a 16-bit KV cache (each run as BF16 and as F16): V1, V2, standard, GQA,
// odd sizes, two threads, a cache below the decode path's 256 keys, a tiled prefill.
const std::vector<AttnCase>& cache16_test_cases();

inline std::ostream& operator<<(std::ostream& os, const AttnCase& c) {
  return os << c.name << " (" << c.str() << ")";
}

}  // namespace diffattn::bench
