// The reference (oracle) of the operator family: plain loops, one query row at a time,
// double accumulation. Every fast path is tested against these functions, and these against
// PyTorch, finite differences and the textbook's worked numbers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "diffattn/kernels/attention.h"
#include "kernels/fused.h"
#include "kernels/indexing.h"

namespace diffattn::kernels {

namespace {

// A forward whose K/V are 16-bit (kv_dtype BF16 or F16) as one over float32 copies: k and v
// are converted into `k` (B, Tk, key_heads, D) and `v` (B, Tk, G, Dv), contiguous, and the
// returned params read them (kv_dtype F32). Memory B * Tk * (key_heads * D + G * Dv) floats:
// for the reference, whose work grows with Tq * Tk anyway (the tiled forward widens tile by
// tile as it packs instead).
AttnParams with_f32_kv(const AttnParams& p, std::vector<float>& k, std::vector<float>& v) {
  AttnParams f = p;
  const int64_t KH = p.key_heads();
  k.resize(static_cast<size_t>(p.B * p.Tk * KH * p.D));
  v.resize(static_cast<size_t>(p.B * p.Tk * p.G * p.Dv));
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < p.Tk; ++t) {
      for (int64_t h = 0; h < KH; ++h) {
        convert_to_f32(&k[static_cast<size_t>(((b * p.Tk + t) * KH + h) * p.D)],
                       p.kh() + b * p.k_batch_stride + t * p.k_row_stride + h * p.k_head_stride,
                       p.kv_dtype, p.D);
      }
      for (int64_t g = 0; g < p.G; ++g) {
        convert_to_f32(&v[static_cast<size_t>(((b * p.Tk + t) * p.G + g) * p.Dv)],
                       p.vh() + b * p.v_batch_stride + t * p.v_row_stride + g * p.v_head_stride,
                       p.kv_dtype, p.Dv);
      }
    }
  }
  f.kv_dtype = DType::F32;
  f.k = k.data();
  f.v = v.data();
  f.k_head_stride = p.D;
  f.k_row_stride = KH * p.D;
  f.k_batch_stride = p.Tk * KH * p.D;
  f.v_head_stride = p.Dv;
  f.v_row_stride = p.G * p.Dv;
  f.v_batch_stride = p.Tk * p.G * p.Dv;
  return f;
}


// Softmax of one query row of map m over its visible keys 0..n-1, in double:
// probs[j] = exp(s_j - lse), s_j = scale * q.k_j. Returns lse (+inf when n == 0).
double row_softmax(const Rows& r, int64_t b, int64_t i, int64_t h, int m, int64_t n,
                   std::vector<double>& probs) {
  const AttnProblem& p = r.p;
  const float* qi = r.q(b, i, r.q_head(h, m));
  const int64_t kh = r.key_head(h, m);
  probs.assign(static_cast<size_t>(p.Tk), 0.0);
  if (n <= 0) return std::numeric_limits<double>::infinity();
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = r.k(b, j, kh);
    double s = 0;
    for (int64_t d = 0; d < p.D; ++d) s += static_cast<double>(qi[d]) * kj[d];
    probs[j] = s * p.scale;
    mx = std::max(mx, probs[j]);
  }
  double sum = 0;  // mx is the row max, so every exp(s - mx) <= 1 and the sum cannot overflow
  for (int64_t j = 0; j < n; ++j) sum += std::exp(probs[j] - mx);
  const double lse = mx + std::log(sum);
  for (int64_t j = 0; j < n; ++j) probs[j] = std::exp(probs[j] - lse);
  return lse;
}

// Number of keys query row i sees.
int64_t visible(const AttnProblem& p, int64_t i) {
  return std::max<int64_t>(0, std::min(p.last_key(i) + 1, p.Tk));
}

}  // namespace

void attention_fwd_ref(const AttnParams& p) {
  check_params(p, p.maps == 2 ? "diff_attention" : "attention");
  if (p.kv_dtype != DType::F32) {  // 16-bit K/V: the same sums over their float32 values
    std::vector<float> k, v;
    return attention_fwd_ref(with_f32_kv(p, k, v));
  }
  const Rows r(p);
  std::vector<double> p1, p2, w(static_cast<size_t>(p.Tk)), acc(static_cast<size_t>(p.Dv)),
      acc2(static_cast<size_t>(p.Dv));
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t g = r.group(h);
      for (int64_t i = 0; i < p.Tq; ++i) {
        const int64_t n = visible(p, i);
        const double lse1 = row_softmax(r, b, i, h, 0, n, p1);
        double lse2 = 0;
        if (p.maps == 2) lse2 = row_softmax(r, b, i, h, 1, n, p2);
        if (p.lse) {
          p.lse[r.lse_index(b, p.maps * h, i)] = static_cast<float>(lse1);
          if (p.maps == 2) p.lse[r.lse_index(b, 2 * h + 1, i)] = static_cast<float>(lse2);
        }
        // Weights of the value rows: A1 (standard), A1 - lam A2 (signed, arXiv:2410.05258
        // Eq. 1), or max(A1 - lam A2, 0) renormalised per row (clamp, the textbook's variant).
        const double lam = p.maps == 2 ? r.lam(b, i, h) : 0.0;
        double wsum = 0;
        for (int64_t j = 0; j < n; ++j) {
          w[j] = p.maps == 2 ? p1[j] - lam * p2[j] : p1[j];
          if (p.maps == 2 && p.mode == DiffMode::Clamp) {
            w[j] = std::max(w[j], 0.0);
            wsum += w[j];
          }
        }
        // A row that clamps to all zeros stays zero rather than dividing by zero.
        const double norm =
            (p.maps == 2 && p.mode == DiffMode::Clamp) ? (wsum > 0 ? 1.0 / wsum : 0.0) : 1.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        std::fill(acc2.begin(), acc2.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const float* vj = r.v(b, j, g);
          for (int64_t d = 0; d < p.Dv; ++d) acc[d] += w[j] * vj[d];
          if (p.maps == 2) {
            for (int64_t d = 0; d < p.Dv; ++d) acc2[d] += p2[j] * vj[d];
          }
        }
        float* o = r.out(b, i, h);
        for (int64_t d = 0; d < p.Dv; ++d) o[d] = static_cast<float>(acc[d] * norm);
        if (p.maps == 2 && p.o2) {
          float* o2 = p.o2 + r.o2_index(b, i, h);
          for (int64_t d = 0; d < p.Dv; ++d) o2[d] = static_cast<float>(acc2[d]);
        }
      }
    }
  }
}

// Gradients by the chain rule through softmax, in double. saved_lse (the reference backend,
// which like every backend honours what the forward saved): the maps are P_ij = exp(s_ij - lse_i)
// with the saved lse and the row sums sum_j P_ij dP_ij come from the saved out and o2, the fused
// backward's formulas. Otherwise (the oracle) both are recomputed from q and k: it trusts neither
// lse nor o2, so comparing a backward that uses them with it also checks what the forward saved.
//   out_i  = sum_j (P1_ij + c_i P2_ij) v_j,  c_i = -lam_i             (c = 0 for standard)
//   dP_ij  = dout_i . v_j                                               (shared by both maps)
//   dS1_ij = P1_ij (dP_ij - sum_j' P1_ij' dP_ij')                       (softmax Jacobian)
//   dS2_ij = c_i P2_ij (dP_ij - sum_j' P2_ij' dP_ij')
//   dlam_i = -sum_j P2_ij dP_ij = -dout_i . (A2 V)_i
namespace {

// Row i of map m's probabilities from the saved lse: exp(scale * q.k_j - lse), in double.
void row_probs_saved(const Rows& r, const float* lse_saved, int64_t b, int64_t i, int64_t h, int m,
                     int64_t n, std::vector<double>& probs) {
  const AttnProblem& p = r.p;
  const float* qi = r.q(b, i, r.q_head(h, m));
  const int64_t kh = r.key_head(h, m);
  const double lse = lse_saved[r.lse_index(b, r.q_head(h, m), i)];
  probs.assign(static_cast<size_t>(p.Tk), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = r.k(b, j, kh);
    double s = 0;
    for (int64_t d = 0; d < p.D; ++d) s += static_cast<double>(qi[d]) * kj[d];
    probs[j] = std::exp(s * p.scale - lse);
  }
}

void bwd_ref(const AttnBwdParams& p, bool saved_lse) {
  const Rows r(p);
  const int64_t kh_n = p.key_heads();
  // Accumulators in double, contiguous: dk (B, Tk, kh, D), dv (B, Tk, G, Dv).
  std::vector<double> dk(static_cast<size_t>(p.B * p.Tk * kh_n * p.D), 0.0);
  std::vector<double> dv(static_cast<size_t>(p.B * p.Tk * p.G * p.Dv), 0.0);
  std::vector<double> dlam_pair(static_cast<size_t>(p.H), 0.0);
  std::vector<double> pm[2], dP(static_cast<size_t>(p.Tk)), dq(static_cast<size_t>(p.D));

  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t g = r.group(h);
      for (int64_t i = 0; i < p.Tq; ++i) {
        const int64_t n = visible(p, i);
        for (int m = 0; m < p.maps; ++m) {
          if (saved_lse) {
            row_probs_saved(r, p.lse, b, i, h, m, n, pm[m]);
          } else {
            row_softmax(r, b, i, h, m, n, pm[m]);
          }
        }
        const float* doi = r.dout(b, i, h);
        for (int64_t j = 0; j < n; ++j) {
          const float* vj = r.v(b, j, g);
          double s = 0;
          for (int64_t d = 0; d < p.Dv; ++d) s += static_cast<double>(doi[d]) * vj[d];
          dP[j] = s;
        }
        const double c = p.maps == 2 ? -r.lam(b, i, h) : 0.0;
        // dv_j += (P1_ij + c P2_ij) dout_i
        for (int64_t j = 0; j < n; ++j) {
          const double wj = p.maps == 2 ? pm[0][j] + c * pm[1][j] : pm[0][j];
          double* dvj = &dv[static_cast<size_t>(((b * p.Tk + j) * p.G + g) * p.Dv)];
          for (int64_t d = 0; d < p.Dv; ++d) dvj[d] += wj * doi[d];
        }
        for (int m = 0; m < p.maps; ++m) {
          const std::vector<double>& P = pm[m];
          double rowdot = 0;  // sum_j P_ij dP_ij = dout_i . (map m's output)_i
          if (saved_lse) {
            // From the saved outputs, as the fused backward does: map 1's output is
            // out + lam o2 (out alone for standard attention), map 2's is o2.
            const float* out = r.saved_out(b, i, h);
            const float* o2 = p.maps == 2 ? p.o2 + r.o2_index(b, i, h) : nullptr;
            for (int64_t d = 0; d < p.Dv; ++d) {
              const double o = m == 1 ? o2[d] : o2 ? out[d] + r.lam(b, i, h) * o2[d] : out[d];
              rowdot += static_cast<double>(doi[d]) * o;
            }
          } else {
            for (int64_t j = 0; j < n; ++j) rowdot += P[j] * dP[j];
          }
          if (m == 1) {
            const double dl = -rowdot;
            if (p.lam_per_token) {
              p.dlam[(b * p.Tq + i) * p.H + h] = static_cast<float>(dl);
            } else {
              dlam_pair[h] += dl;
            }
          }
          const double coef = m == 0 ? 1.0 : c;
          const float* qi = r.q(b, i, r.q_head(h, m));
          const int64_t kh = r.key_head(h, m);
          std::fill(dq.begin(), dq.end(), 0.0);
          for (int64_t j = 0; j < n; ++j) {
            const double ds = coef * P[j] * (dP[j] - rowdot) * p.scale;
            const float* kj = r.k(b, j, kh);
            double* dkj = &dk[static_cast<size_t>(((b * p.Tk + j) * kh_n + kh) * p.D)];
            for (int64_t d = 0; d < p.D; ++d) {
              dq[d] += ds * kj[d];
              dkj[d] += ds * qi[d];
            }
          }
          float* dqi = p.dq + (r.q(b, i, r.q_head(h, m)) - p.q);
          for (int64_t d = 0; d < p.D; ++d) dqi[d] = static_cast<float>(dq[d]);
        }
      }
    }
  }
  // Write the accumulated gradients through the (possibly strided) layouts of k and v.
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t j = 0; j < p.Tk; ++j) {
      for (int64_t kh = 0; kh < kh_n; ++kh) {
        float* dst = p.dk + (r.k(b, j, kh) - p.kf());
        const double* src = &dk[static_cast<size_t>(((b * p.Tk + j) * kh_n + kh) * p.D)];
        for (int64_t d = 0; d < p.D; ++d) dst[d] = static_cast<float>(src[d]);
      }
      for (int64_t g = 0; g < p.G; ++g) {
        float* dst = p.dv + (r.v(b, j, g) - p.vf());
        const double* src = &dv[static_cast<size_t>(((b * p.Tk + j) * p.G + g) * p.Dv)];
        for (int64_t d = 0; d < p.Dv; ++d) dst[d] = static_cast<float>(src[d]);
      }
    }
  }
  if (p.maps == 2 && p.lam_scalar) {
    double s = 0;  // every pair's share in double, rounded once
    for (int64_t h = 0; h < p.H; ++h) s += dlam_pair[h];
    p.dlam[0] = static_cast<float>(s);
  } else if (p.maps == 2 && !p.lam_per_token) {
    for (int64_t h = 0; h < p.H; ++h) p.dlam[h] = static_cast<float>(dlam_pair[h]);
  }
}

}  // namespace

void attention_bwd_ref(const AttnBwdParams& p) {
  check_params(p, p.maps == 2 ? "diff_attention_backward" : "attention_backward");
  bwd_ref(p, true);
}

void attention_bwd_oracle(const AttnBwdParams& p) {
  check_params(p, p.maps == 2 ? "diff_attention_backward" : "attention_backward");
  bwd_ref(p, false);
}

void attention_probs(const AttnProblem& p, const float* lse_saved, int map, float* probs) {
  check_params(p, "attention_probs");
  if (p.kv_dtype != DType::F32) {
    throw InvalidArgument(std::string("attention_probs: k and v are ") + dtype_name(p.kv_dtype) +
                          ", expected float32");
  }
  if (map < 0 || map >= p.maps) {
    throw InvalidArgument("attention_probs: map must be 0" +
                          std::string(p.maps == 2 ? " or 1" : "") + ", got " +
                          std::to_string(map));
  }
  if (lse_saved == nullptr) throw InvalidArgument("attention_probs: needs lse saved by a forward");
  const Rows r(p);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t qh = r.q_head(h, map), kh = r.key_head(h, map);
      for (int64_t i = 0; i < p.Tq; ++i) {
        float* row = probs + ((b * p.H + h) * p.Tq + i) * p.Tk;
        const double lse = lse_saved[r.lse_index(b, qh, i)];
        const float* qi = r.q(b, i, qh);
        const int64_t n = visible(p, i);
        for (int64_t j = 0; j < p.Tk; ++j) {
          if (j >= n) {
            row[j] = 0.0f;
            continue;
          }
          const float* kj = r.k(b, j, kh);
          double s = 0;
          for (int64_t d = 0; d < p.D; ++d) s += static_cast<double>(qi[d]) * kj[d];
          row[j] = static_cast<float>(std::exp(s * p.scale - lse));
        }
      }
    }
  }
}

}  // namespace diffattn::kernels

namespace diffattn::kernels {

void diff_row_weights(const float* a1, const float* a2, float lam, DiffMode mode, int64_t n,
                      float* w) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    double x = static_cast<double>(a1[j]) - static_cast<double>(lam) * a2[j];
    if (mode == DiffMode::Clamp) x = std::max(x, 0.0);
    w[j] = static_cast<float>(x);
    sum += x;
  }
  if (mode == DiffMode::Clamp) {
    const double inv = sum > 0 ? 1.0 / sum : 0.0;
    for (int64_t j = 0; j < n; ++j) w[j] = static_cast<float>(w[j] * inv);
  }
}

}  // namespace diffattn::kernels
