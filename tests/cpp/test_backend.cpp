// The backend seam (include/diffattn/nn/backend.h): the cpu table's ops against the reference
// table's (double accumulation) on awkward shapes, by FlashAttention's rule (at most 2x the error
// of a plain float32 loop against the double result); both tables' attention entries are the
// kernels they name, the reference backward honouring the saved lse; a counting table shows that
// every hot op of a layer body goes through the runner's context (nothing reaches the kernels
// past it); a table lacking an op, or a type, is refused when the runner is made; and whole
// models run on the reference table agree with the cpu one.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/base/error.h"
#include "diffattn/infer/batch.h"
#include "diffattn/infer/kv_store.h"
#include "diffattn/infer/session.h"
#include "diffattn/model/model.h"
#include "diffattn/model/train_context.h"
#include "diffattn/nn/backend.h"
#include "testing.h"

namespace diffattn {
namespace {

using testing::randn;

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

double max_err(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// FlashAttention's rule: got within 2x the plain float32 computation's error against the
// double reference, plus a floor of a few float32 roundings of the values' size.
void expect_rule(const char* what, const std::vector<float>& got, const std::vector<float>& ref,
                 const std::vector<float>& plain) {
  const double floor = 4.0 * FLT_EPSILON * std::max(1.0, max_abs(ref));
  EXPECT_LE(max_err(got, ref), 2.0 * max_err(plain, ref) + floor)
      << what << ": plain float32 error " << max_err(plain, ref);
  // The untouched padding (NaN in all three) must stay equal too.
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(std::isnan(got[i]), std::isnan(ref[i])) << what << " at " << i;
  }
}

TEST(Backend, LinearMatchesTheReferenceAcrossTheFewAndManyRowPaths) {
  const int64_t C = 67, OC = 45, ldo = OC + 3;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const std::vector<float> w32 = randn(static_cast<size_t>(OC * C), 3, 0.2f);
    std::vector<uint16_t> w16(w32.size());
    std::vector<float> wr(w32.size());  // the weights as the kernels read them
    if (dt != DType::F32) {
      convert_from_f32(w16.data(), w32.data(), dt, OC * C);
      convert_to_f32(wr.data(), w16.data(), dt, OC * C);
    } else {
      wr = w32;
    }
    const TensorView w = dt == DType::F32 ? TensorView(w32.data(), {OC, C}) : TensorView(w16.data(), dt, {OC, C});
    for (int64_t N : {int64_t{1}, int64_t{3}, nn::few_rows_max(dt), nn::few_rows_max(dt) + 1, int64_t{150}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(N));
      const std::vector<float> x = randn(static_cast<size_t>(N * C), 4);
      std::vector<float> got(static_cast<size_t>(N * ldo), NAN), ref = got, plain = got;
      nn::cpu_context().linear(got.data(), x.data(), w, N, C, OC, ldo);
      nn::reference_context().linear(ref.data(), x.data(), w, N, C, OC, ldo);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t o = 0; o < OC; ++o) {
          float acc = 0;
          for (int64_t c = 0; c < C; ++c) acc += x[static_cast<size_t>(n * C + c)] * wr[static_cast<size_t>(o * C + c)];
          plain[static_cast<size_t>(n * ldo + o)] = acc;
        }
      }
      expect_rule("linear", got, ref, plain);
    }
  }
}

TEST(Backend, NormRopeAndSwiGluMatchTheReference) {
  {  // RMSNorm over strided rows
    const int64_t N = 5, C = 67, ldi = 70, ldo = 71;
    const std::vector<float> x = randn(static_cast<size_t>(N * ldi), 5, 3.0f), w = randn(C, 6);
    std::vector<float> got(static_cast<size_t>(N * ldo), NAN), ref = got, plain = got;
    std::vector<float> rg(N), rr(N);
    nn::cpu_context().rmsnorm(got.data(), rg.data(), x.data(), w.data(), N, C, 1e-5f, ldi, ldo);
    nn::reference_context().rmsnorm(ref.data(), rr.data(), x.data(), w.data(), N, C, 1e-5f, ldi, ldo);
    for (int64_t i = 0; i < N; ++i) {
      float ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += x[static_cast<size_t>(i * ldi + c)] * x[static_cast<size_t>(i * ldi + c)];
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + 1e-5f);
      for (int64_t c = 0; c < C; ++c) plain[static_cast<size_t>(i * ldo + c)] = x[static_cast<size_t>(i * ldi + c)] * r * w[static_cast<size_t>(c)];
    }
    expect_rule("rmsnorm", got, ref, plain);
    for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(rg[static_cast<size_t>(i)], rr[static_cast<size_t>(i)], 1e-6 * rr[static_cast<size_t>(i)]);
  }
  for (bool inverse : {false, true}) {  // RoPE in place over (B, T, nh, D) with padded rows
    const int64_t B = 2, T = 3, nh = 3, D = 8, ld = nh * D + 5, lb = T * ld + 7, half = D / 2;
    std::vector<float> cos_t(static_cast<size_t>(T * half)), sin_t(cos_t.size());
    nn::rope_table(cos_t.data(), sin_t.data(), 11, T, D, 10000.0);
    const std::vector<float> x = randn(static_cast<size_t>(B * lb), 7);
    std::vector<float> got = x, ref = x, plain = x;
    nn::cpu_context().rope(got.data(), cos_t.data(), sin_t.data(), B, T, nh, D, ld, lb, inverse);
    nn::reference_context().rope(ref.data(), cos_t.data(), sin_t.data(), B, T, nh, D, ld, lb, inverse);
    const float sg = inverse ? -1.0f : 1.0f;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < nh; ++h) {
          for (int64_t j = 0; j < half; ++j) {
            const size_t at = static_cast<size_t>(b * lb + t * ld + h * D + 2 * j);
            const float c = cos_t[static_cast<size_t>(t * half + j)], s = sg * sin_t[static_cast<size_t>(t * half + j)];
            plain[at] = x[at] * c - x[at + 1] * s;
            plain[at + 1] = x[at] * s + x[at + 1] * c;
          }
        }
      }
    }
    expect_rule(inverse ? "rope inverse" : "rope", got, ref, plain);
  }
  {  // SwiGLU with gate and up as column blocks of one buffer
    const int64_t N = 7, F = 33, ldg = 2 * F;
    const std::vector<float> gu = randn(static_cast<size_t>(N * ldg), 8, 2.0f);
    std::vector<float> got(static_cast<size_t>(N * F), NAN), ref = got, plain = got;
    nn::cpu_context().swiglu(got.data(), gu.data(), gu.data() + F, N, F, ldg);
    nn::reference_context().swiglu(ref.data(), gu.data(), gu.data() + F, N, F, ldg);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t f = 0; f < F; ++f) {
        const float g = gu[static_cast<size_t>(i * ldg + f)];
        plain[static_cast<size_t>(i * F + f)] = g / (1.0f + std::exp(-g)) * gu[static_cast<size_t>(i * ldg + F + f)];
      }
    }
    expect_rule("swiglu", got, ref, plain);
  }
}

// The other families' norms: SambaY's LayerNorm and Motif-2's PolyNorm gate, both tables
// against a plain float32 computation by the 2x rule.
TEST(Backend, LayerNormAndPolyNormMatchTheReference) {
  {
    const int64_t N = 6, C = 67;
    const std::vector<float> x = randn(static_cast<size_t>(N * C), 31, 3.0f), w = randn(C, 32), b = randn(C, 33);
    std::vector<float> got(static_cast<size_t>(N * C)), ref = got, plain = got;
    nn::cpu_context().layernorm(got.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    nn::reference_context().layernorm(ref.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    for (int64_t i = 0; i < N; ++i) {
      float s = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) s += x[static_cast<size_t>(i * C + c)];
      const float mean = s / static_cast<float>(C);
      for (int64_t c = 0; c < C; ++c) {
        const float d = x[static_cast<size_t>(i * C + c)] - mean;
        v += d * d;
      }
      const float r = 1.0f / std::sqrt(v / static_cast<float>(C) + 1e-5f);
      for (int64_t c = 0; c < C; ++c) {
        plain[static_cast<size_t>(i * C + c)] =
            (x[static_cast<size_t>(i * C + c)] - mean) * r * w[static_cast<size_t>(c)] + b[static_cast<size_t>(c)];
      }
    }
    expect_rule("layernorm", got, ref, plain);
  }
  {
    const int64_t N = 5, F = 41, ldg = 2 * F;
    const std::vector<float> gu = randn(static_cast<size_t>(N * ldg), 34, 1.5f), w = randn(3, 35), b = randn(1, 36);
    std::vector<float> got(static_cast<size_t>(N * F)), ref = got, plain = got;
    const float eps = 1e-6f;
    nn::cpu_context().polynorm(got.data(), gu.data(), gu.data() + F, N, F, ldg, w.data(), b.data(), eps);
    nn::reference_context().polynorm(ref.data(), gu.data(), gu.data() + F, N, F, ldg, w.data(), b.data(), eps);
    for (int64_t i = 0; i < N; ++i) {
      float s1 = 0, s2 = 0, s3 = 0;
      for (int64_t f = 0; f < F; ++f) {
        const float z = gu[static_cast<size_t>(i * ldg + f)];
        s1 += z * z, s2 += z * z * z * z, s3 += z * z * z * z * z * z;
      }
      const float n = static_cast<float>(F);
      const float r1 = 1.0f / std::sqrt(s1 / n + eps), r2 = 1.0f / std::sqrt(s2 / n + eps),
                  r3 = 1.0f / std::sqrt(s3 / n + eps);
      for (int64_t f = 0; f < F; ++f) {
        const float z = gu[static_cast<size_t>(i * ldg + f)];
        plain[static_cast<size_t>(i * F + f)] =
            (w[0] * z * z * z * r3 + w[1] * z * z * r2 + w[2] * z * r1 + b[0]) * gu[static_cast<size_t>(i * ldg + F + f)];
      }
    }
    expect_rule("polynorm", got, ref, plain);
  }
}

// The training backward's ops (products, RMSNorm, SwiGLU) of both tables against each other
// and a plain float32 computation, by the 2x rule, on strided and accumulating calls.
TEST(Backend, DenseBackwardsMatchTheReference) {
  {  // linear: dinp += dout W (and overwritten), dW += dout^T inp; dout rows strided
    const int64_t N = 37, C = 29, OC = 23, ldd = OC + 4;
    const std::vector<float> d = randn(static_cast<size_t>(N * ldd), 11), x = randn(static_cast<size_t>(N * C), 12),
                             w = randn(static_cast<size_t>(OC * C), 13, 0.3f), di0 = randn(static_cast<size_t>(N * C), 14),
                             dw0 = randn(static_cast<size_t>(OC * C), 15);
    for (bool overwrite : {false, true}) {
      SCOPED_TRACE(overwrite ? "overwrite" : "accumulate");
      std::vector<float> gi = di0, gw = dw0, ri = di0, rw = dw0, pi = di0, pw = dw0;
      nn::cpu_context().linear_backward(gi.data(), gw.data(), d.data(), x.data(), w.data(), N, C, OC, ldd, overwrite);
      nn::reference_context().linear_backward(ri.data(), rw.data(), d.data(), x.data(), w.data(), N, C, OC, ldd,
                                              overwrite);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t c = 0; c < C; ++c) {
          float acc = overwrite ? 0.0f : di0[static_cast<size_t>(n * C + c)];
          for (int64_t o = 0; o < OC; ++o) acc += d[static_cast<size_t>(n * ldd + o)] * w[static_cast<size_t>(o * C + c)];
          pi[static_cast<size_t>(n * C + c)] = acc;
        }
      }
      for (int64_t o = 0; o < OC; ++o) {
        for (int64_t c = 0; c < C; ++c) {
          float acc = dw0[static_cast<size_t>(o * C + c)];
          for (int64_t n = 0; n < N; ++n) acc += d[static_cast<size_t>(n * ldd + o)] * x[static_cast<size_t>(n * C + c)];
          pw[static_cast<size_t>(o * C + c)] = acc;
        }
      }
      expect_rule("linear_backward dinp", gi, ri, pi);
      expect_rule("linear_backward dweight", gw, rw, pw);
    }
    // dinp null: only the weight's gradient
    std::vector<float> gw = dw0, rw = dw0;
    nn::cpu_context().linear_backward(nullptr, gw.data(), d.data(), x.data(), w.data(), N, C, OC, ldd);
    nn::reference_context().linear_backward(nullptr, rw.data(), d.data(), x.data(), w.data(), N, C, OC, ldd);
    EXPECT_LE(max_err(gw, rw), 1e-4 * max_abs(rw));
  }
  {  // RMSNorm from the saved rstd, dout and inp rows strided, accumulating
    const int64_t N = 9, C = 67, ldd = 70, ldi = 69;
    const std::vector<float> x = randn(static_cast<size_t>(N * ldi), 16, 2.0f), w = randn(C, 17),
                             d = randn(static_cast<size_t>(N * ldd), 18), di0 = randn(static_cast<size_t>(N * C), 19),
                             dw0 = randn(C, 20);
    std::vector<float> rstd(N), out(static_cast<size_t>(N * C));
    nn::reference_context().rmsnorm(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, ldi, 0);
    std::vector<float> gi = di0, gw = dw0, ri = di0, rw = dw0, pi = di0, pw = dw0;
    nn::cpu_context().rmsnorm_backward(gi.data(), gw.data(), d.data(), x.data(), w.data(), rstd.data(), N, C, ldd, ldi);
    nn::reference_context().rmsnorm_backward(ri.data(), rw.data(), d.data(), x.data(), w.data(), rstd.data(), N, C,
                                             ldd, ldi);
    for (int64_t i = 0; i < N; ++i) {
      const float r = rstd[static_cast<size_t>(i)];
      float dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dot += d[static_cast<size_t>(i * ldd + c)] * w[static_cast<size_t>(c)] * x[static_cast<size_t>(i * ldi + c)];
      }
      for (int64_t c = 0; c < C; ++c) {
        const float dy = d[static_cast<size_t>(i * ldd + c)], xc = x[static_cast<size_t>(i * ldi + c)];
        pi[static_cast<size_t>(i * C + c)] += r * dy * w[static_cast<size_t>(c)] - r * r * r * dot / static_cast<float>(C) * xc;
        pw[static_cast<size_t>(c)] += dy * xc * r;
      }
    }
    expect_rule("rmsnorm_backward dinp", gi, ri, pi);
    expect_rule("rmsnorm_backward dweight", gw, rw, pw);
  }
  {  // SwiGLU with gate and up (and their gradients) as column blocks of one buffer
    const int64_t N = 7, F = 33, ldg = 2 * F;
    const std::vector<float> gu = randn(static_cast<size_t>(N * ldg), 21, 2.0f), d = randn(static_cast<size_t>(N * F), 22),
                             dgu0 = randn(static_cast<size_t>(N * ldg), 23);
    std::vector<float> got = dgu0, ref = dgu0, plain = dgu0;
    nn::cpu_context().swiglu_backward(got.data(), got.data() + F, d.data(), gu.data(), gu.data() + F, N, F, ldg);
    nn::reference_context().swiglu_backward(ref.data(), ref.data() + F, d.data(), gu.data(), gu.data() + F, N, F, ldg);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t f = 0; f < F; ++f) {
        const float g = gu[static_cast<size_t>(i * ldg + f)], u = gu[static_cast<size_t>(i * ldg + F + f)];
        const float dy = d[static_cast<size_t>(i * F + f)], sg = 1.0f / (1.0f + std::exp(-g));
        plain[static_cast<size_t>(i * ldg + f)] += dy * u * sg * (1.0f + g * (1.0f - sg));
        plain[static_cast<size_t>(i * ldg + F + f)] += dy * g * sg;
      }
    }
    expect_rule("swiglu_backward", got, ref, plain);
  }
}

// The tables' attention entries are the kernels they name: bit for bit.
TEST(Backend, AttentionEntriesAreTheirKernelsAndTheReferenceBackwardReadsTheSavedLse) {
  testing::Problem pr;
  pr.B = 1, pr.Tq = 37, pr.Tk = 37, pr.H = 2, pr.G = 1, pr.D = 8, pr.Dv = 16, pr.maps = 2;
  pr.causal = true;
  pr.randomize(9);
  for (const nn::ExecContext* ctx : {&nn::cpu_context(), &nn::reference_context()}) {
    const bool ref = ctx == &nn::reference_context();
    SCOPED_TRACE(ctx->ops->name);
    const testing::FwdResult want = testing::run_fwd(pr, ref ? kernels::Backend::Reference : kernels::Backend::Auto);
    kernels::AttnParams p = pr.params();
    testing::FwdResult got;
    got.out.assign(want.out.size(), NAN);
    got.lse.assign(want.lse.size(), NAN);
    got.o2.assign(want.o2.size(), NAN);
    p.out = got.out.data(), p.lse = got.lse.data(), p.o2 = got.o2.data();
    ctx->attention(p);
    EXPECT_EQ(got.out, want.out);
    EXPECT_EQ(got.lse, want.lse);
    // The backward: the table's entry against the kernel it names, on the saved statistics.
    const std::vector<float> dout = randn(got.out.size(), 10);
    auto backward = [&](bool through_table, const std::vector<float>& lse) {
      kernels::AttnBwdParams bp(p);
      bp.lse = lse.data();
      std::vector<float> g(pr.q.size() + pr.k.size() + pr.v.size() + pr.lam.size(), NAN);
      bp.dout = dout.data();
      bp.dq = g.data(), bp.dk = bp.dq + pr.q.size(), bp.dv = bp.dk + pr.k.size(), bp.dlam = bp.dv + pr.v.size();
      if (through_table) {
        ctx->attention_backward(bp);
      } else if (ref) {
        kernels::attention_bwd_ref(bp);
      } else {
        kernels::attention_bwd(bp);
      }
      return g;
    };
    const std::vector<float> g = backward(true, got.lse);
    EXPECT_EQ(g, backward(false, got.lse));
    // Honouring the saved lse: a shifted lse scales every map, so the gradients change.
    std::vector<float> shifted = got.lse;
    for (float& x : shifted) x += 1.0f;
    EXPECT_NE(backward(true, shifted), g);
  }
}

// A table that counts the calls of each op and passes them to the cpu kernels.
int g_calls[nn::kNumOps];
nn::OpTable counting_table() {
  nn::OpTable t = nn::cpu_ops();
  t.name = "counting";
  t.attention = [](const nn::ExecContext& c, const kernels::AttnParams& p) {
    ++g_calls[static_cast<int>(nn::Op::Attention)];
    nn::cpu_ops().attention(c, p);
  };
  t.attention_backward = [](const nn::ExecContext& c, const kernels::AttnBwdParams& p) {
    ++g_calls[static_cast<int>(nn::Op::AttentionBackward)];
    nn::cpu_ops().attention_backward(c, p);
  };
  t.paged_attention = [](const nn::ExecContext& c, const kernels::PagedAttnParams& p) {
    ++g_calls[static_cast<int>(nn::Op::PagedAttention)];
    nn::cpu_ops().paged_attention(c, p);
  };
  t.linear_few_rows = [](const nn::ExecContext& c, float* o, const float* i, const TensorView& w, int64_t N,
                         int64_t C, int64_t OC, int64_t ldo) {
    ++g_calls[static_cast<int>(nn::Op::LinearFewRows)];
    nn::cpu_ops().linear_few_rows(c, o, i, w, N, C, OC, ldo);
  };
  t.linear_many_rows = [](const nn::ExecContext& c, float* o, const float* i, const TensorView& w, int64_t N,
                          int64_t C, int64_t OC, int64_t ldo) {
    ++g_calls[static_cast<int>(nn::Op::LinearManyRows)];
    nn::cpu_ops().linear_many_rows(c, o, i, w, N, C, OC, ldo);
  };
  t.rmsnorm = [](const nn::ExecContext& c, float* o, float* r, const float* i, const float* w, int64_t N,
                 int64_t C, float eps, int64_t ldi, int64_t ldo) {
    ++g_calls[static_cast<int>(nn::Op::RmsNorm)];
    nn::cpu_ops().rmsnorm(c, o, r, i, w, N, C, eps, ldi, ldo);
  };
  t.rope = [](const nn::ExecContext& c, float* x, const float* co, const float* si, int64_t B, int64_t T,
              int64_t nh, int64_t D, int64_t ld, int64_t lb, bool inv) {
    ++g_calls[static_cast<int>(nn::Op::Rope)];
    nn::cpu_ops().rope(c, x, co, si, B, T, nh, D, ld, lb, inv);
  };
  t.swiglu = [](const nn::ExecContext& c, float* o, const float* g, const float* u, int64_t N, int64_t F,
                int64_t ldg) {
    ++g_calls[static_cast<int>(nn::Op::SwiGlu)];
    nn::cpu_ops().swiglu(c, o, g, u, N, F, ldg);
  };
  t.linear_backward = [](const nn::ExecContext& c, float* di, float* dw, const float* d, const float* i,
                         const float* w, int64_t N, int64_t C, int64_t OC, int64_t ldd, bool ow) {
    ++g_calls[static_cast<int>(nn::Op::LinearBackward)];
    nn::cpu_ops().linear_backward(c, di, dw, d, i, w, N, C, OC, ldd, ow);
  };
  t.rmsnorm_backward = [](const nn::ExecContext& c, float* di, float* dw, const float* d, const float* i,
                          const float* w, const float* r, int64_t N, int64_t C, int64_t ldd, int64_t ldi) {
    ++g_calls[static_cast<int>(nn::Op::RmsNormBackward)];
    nn::cpu_ops().rmsnorm_backward(c, di, dw, d, i, w, r, N, C, ldd, ldi);
  };
  t.swiglu_backward = [](const nn::ExecContext& c, float* dg, float* du, const float* d, const float* g,
                         const float* u, int64_t N, int64_t F, int64_t ldg) {
    ++g_calls[static_cast<int>(nn::Op::SwiGluBackward)];
    nn::cpu_ops().swiglu_backward(c, dg, du, d, g, u, N, F, ldg);
  };
  return t;
}

int calls(nn::Op op) { return g_calls[static_cast<int>(op)]; }

model::ModelConfig tiny(nn::AttnKind kind) {
  model::ModelConfig c;
  c.attention = kind;
  c.vocab_size = 29;
  c.d_model = 16;
  c.n_layers = 2;
  c.ffn_dim = 24;
  c.max_seq_len = 64;
  c.head_dim = 4;
  c.n_heads = kind == nn::AttnKind::DiffV1 ? 2 : 4;
  c.n_kv_heads = kind == nn::AttnKind::DiffV1 ? 1 : 2;
  return c;
}

// Every hot op of a layer body reaches the kernels through the runner's context: an inference
// step and a training forward and backward counted op by op. Per layer: RMSNorm before the
// attention and the FFN (and V1's per-head norm), RoPE on q and k, the projections (q/k/v, out,
// gate|up stacked, down), one attention call, SwiGLU; then the final norm and the head.
TEST(Backend, EveryHotOpOfALayerGoesThroughTheContext) {
  const nn::OpTable table = counting_table();
  const nn::ExecContext ctx{&table};
  for (nn::AttnKind kind : {nn::AttnKind::DiffV1, nn::AttnKind::DiffV2, nn::AttnKind::Standard}) {
    SCOPED_TRACE(nn::attn_kind_name(kind));
    const model::ModelConfig c = tiny(kind);
    model::Model m(c);
    m.init_weights(1);
    const int L = static_cast<int>(c.n_layers);
    const int norms = (kind == nn::AttnKind::DiffV1 ? 3 : 2) * L + 1;
    auto expect_step = [&](int attention_op, int linear_few, int linear_many) {
      EXPECT_EQ(calls(nn::Op::RmsNorm), norms);
      EXPECT_EQ(calls(nn::Op::Rope), 2 * L);
      EXPECT_EQ(calls(nn::Op::SwiGlu), L);
      EXPECT_EQ(g_calls[attention_op], L);
      EXPECT_EQ(calls(nn::Op::LinearFewRows), linear_few);
      EXPECT_EQ(calls(nn::Op::LinearManyRows), linear_many);
    };
    const int linears = 4 * L + 1;
    infer::KvStore kv(m, infer::KvStore::Contiguous{64});
    infer::Session session(m, kv, ctx);
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    infer::Batch b;
    std::memset(g_calls, 0, sizeof(g_calls));
    const std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                      17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 1, 2, 3, 4, 5, 6};
    b.add_chunk(prompt.data(), static_cast<int64_t>(prompt.size()), 0, 0);  // 34 rows: many
    session.decode(b, logits.data());
    // The head runs on the one row whose logits are wanted: a few-row product.
    expect_step(static_cast<int>(nn::Op::PagedAttention), 1, linears - 1);
    std::memset(g_calls, 0, sizeof(g_calls));
    b.clear();
    b.add(7, static_cast<int64_t>(prompt.size()), 0, true);  // a decode step: one row
    session.decode(b, logits.data());
    expect_step(static_cast<int>(nn::Op::PagedAttention), linears, 0);

    std::memset(g_calls, 0, sizeof(g_calls));
    model::TrainContext run(m, ctx);
    run.forward(prompt.data(), prompt.data(), 2, 17);
    expect_step(static_cast<int>(nn::Op::Attention), 0, linears);
    run.zero_grads();
    run.backward();
    EXPECT_EQ(calls(nn::Op::AttentionBackward), L);
    EXPECT_EQ(calls(nn::Op::Rope), 2 * L + 2 * L);  // the backward rotates dq, dk back
    // Every product, norm and SwiGLU of the forward has its backward through the context.
    EXPECT_EQ(calls(nn::Op::LinearBackward), linears);
    EXPECT_EQ(calls(nn::Op::RmsNormBackward), norms);
    EXPECT_EQ(calls(nn::Op::SwiGluBackward), L);
  }
}

// A backend that lacks an op (or a type) a runner needs is refused when the runner is made,
// naming the backend and the op.
TEST(Backend, ARunnerRefusesABackendWithoutAnOpItNeeds) {
  const model::ModelConfig c = tiny(nn::AttnKind::DiffV2);
  model::Model m(c);
  m.init_weights(2);
  infer::KvStore kv(m, infer::KvStore::Contiguous{16});
  auto refused = [&](const nn::OpTable& t, bool session, const std::string& words) {
    const nn::ExecContext ctx{&t};
    try {
      if (session) {
        infer::Session s(m, kv, ctx);
      } else {
        model::TrainContext r(m, ctx);
      }
      ADD_FAILURE() << "accepted without " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  nn::OpTable t = nn::cpu_ops();
  t.name = "partial";
  t.rope = nullptr;
  refused(t, true, "Session: backend partial does not support rope (F32)");
  refused(t, false, "TrainContext: backend partial does not support rope (F32)");
  t = nn::cpu_ops();
  t.name = "partial";
  t.paged_attention = nullptr;
  refused(t, true, "does not support paged_attention (F32)");
  EXPECT_NO_THROW(model::TrainContext(m, nn::ExecContext{&t}));  // it runs no paged attention
  t = nn::cpu_ops();
  t.name = "partial";
  t.linear_many_rows = nullptr;
  refused(t, false, "does not support linear_many_rows (F32)");
  t = nn::cpu_ops();
  t.name = "float32-only";
  t.supports = [](nn::Op, DType dt) { return dt == DType::F32; };
  infer::KvStore kv16(m, infer::KvStore::Contiguous{16}, DType::BF16);
  try {
    infer::Session s(m, kv16, nn::ExecContext{&t});
    ADD_FAILURE() << "a BF16 cache accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("does not support paged_attention (BF16)"), std::string::npos) << e.what();
  }
  // The backward's op is checked when the backward runs.
  t = nn::cpu_ops();
  t.name = "forward-only";
  t.attention_backward = nullptr;
  model::TrainContext run(m, nn::ExecContext{&t});
  const std::vector<int32_t> tok{1, 2, 3, 4};
  run.forward(tok.data(), tok.data(), 1, 4);
  run.zero_grads();
  EXPECT_THROW(run.backward(), InvalidArgument);
  for (int which = 0; which < 3; ++which) {
    t = nn::cpu_ops();
    t.name = "no-dense-backward";
    const char* op = which == 0 ? "linear_backward" : which == 1 ? "rmsnorm_backward" : "swiglu_backward";
    if (which == 0) t.linear_backward = nullptr;
    if (which == 1) t.rmsnorm_backward = nullptr;
    if (which == 2) t.swiglu_backward = nullptr;
    model::TrainContext r(m, nn::ExecContext{&t});
    r.forward(tok.data(), tok.data(), 1, 4);
    r.zero_grads();
    try {
      r.backward();
      ADD_FAILURE() << "a backward without " << op;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("backward: backend no-dense-backward does not support ") + op),
                std::string::npos) << e.what();
    }
  }
  // Calling an op the table lacks directly is an error too, never a null call.
  EXPECT_THROW(nn::ExecContext{&t}.attention_backward(kernels::AttnBwdParams{}), InvalidArgument);
}

// The CPU tables read host memory: a view on another device is refused when the params are
// built, naming the builder and the tensor, for float32 and 16-bit K/V alike.
TEST(Backend, ParamsRefuseViewsOnAnotherDeviceNamingTheTensor) {
  const std::vector<float> q = randn(2 * 3 * 4, 1), k = randn(2 * 3 * 4, 2), v = randn(2 * 3 * 4, 3);
  const std::vector<uint16_t> k16(k.size()), v16(v.size());
  const Dims shape{1, 2, 3, 4};
  const Device cuda{DeviceType::CUDA, 0};
  auto refused = [](auto&& f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no error, expected " << want;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("attention: ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  kernels::AttnOptions o;
  refused([&] { kernels::attn_params(TensorView(q.data(), DType::F32, shape, {}, cuda),
                                     {k.data(), shape}, {v.data(), shape}, o); },
          "q is on cuda, expected host memory");
  refused([&] { kernels::attn_params({q.data(), shape}, {k.data(), shape},
                                     TensorView(v.data(), DType::F32, shape, {}, cuda), o); },
          "v is on cuda, expected host memory");
  refused([&] { kernels::attn_params({q.data(), shape}, TensorView(k16.data(), DType::BF16, shape, {}, cuda),
                                     TensorView(v16.data(), DType::BF16, shape), o); },
          "k is on cuda, expected host memory");
  // On the host, 16-bit K/V are taken as they are.
  const kernels::AttnParams p = kernels::attn_params({q.data(), shape}, TensorView(k16.data(), DType::F16, shape),
                                                     TensorView(v16.data(), DType::F16, shape), o);
  EXPECT_EQ(p.k, static_cast<const void*>(k16.data()));
  EXPECT_EQ(p.kv_dtype, DType::F16);
}

// A whole model on the reference table: training forward logits and a session's logits (a
// prompt, then decode steps) agree with the cpu table's.
TEST(Backend, WholeModelsOnTheReferenceTableAgreeWithTheCpuTable) {
  for (nn::AttnKind kind : {nn::AttnKind::DiffV1, nn::AttnKind::DiffV2, nn::AttnKind::Standard}) {
    SCOPED_TRACE(nn::attn_kind_name(kind));
    const model::ModelConfig c = tiny(kind);
    model::Model m(c);
    m.init_weights(3);
    const std::vector<int32_t> tok{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4};
    model::TrainContext cpu(m), ref(m, nn::reference_context());
    const double lc = cpu.forward(tok.data(), tok.data(), 2, 10), lr = ref.forward(tok.data(), tok.data(), 2, 10);
    EXPECT_NEAR(lc, lr, 1e-5 * std::fabs(lr));
    const double scale = std::max(1.0, max_abs(ref.logits()));
    EXPECT_LE(max_err(cpu.logits(), ref.logits()), 1e-5 * scale);
    infer::KvStore kc(m, infer::KvStore::Contiguous{32}), kr(m, infer::KvStore::Contiguous{32});
    infer::Session sc(m, kc), sr(m, kr, nn::reference_context());
    std::vector<float> a(static_cast<size_t>(c.vocab_size)), b(a.size());
    infer::Batch batch;
    batch.add_chunk(tok.data(), 12, 0, 0);
    for (int step = 0; step < 5; ++step) {
      sc.decode(batch, a.data());
      sr.decode(batch, b.data());
      EXPECT_LE(max_err(a, b), 1e-5 * std::max(1.0, max_abs(b))) << "step " << step;
      batch.clear();
      batch.add(tok[static_cast<size_t>(12 + step)], 12 + step, 0, true);
    }
  }
}

}  // namespace
}  // namespace diffattn
