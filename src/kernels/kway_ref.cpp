// The k-way split reference (see kway.h): each map's softmax row in double, the weights
// sum_m c_m A_m (signed) or max(., 0) renormalised (clamp), then the weighted sum of V.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "diffattn/kernels/kway.h"

namespace diffattn::kernels {

namespace {

void check_kway(const KWayParams& p) {
  if (p.maps < 1 || p.maps > 8) {
    throw InvalidArgument("kway_attention: maps must be 1..8, got " + std::to_string(p.maps));
  }
  if (p.B < 1 || p.Tq < 1 || p.Tk < 1 || p.H < 1 || p.D < 1 || p.Dv < 1) {
    throw InvalidArgument("kway_attention: sizes must be >= 1, got B=" + std::to_string(p.B) +
                          " Tq=" + std::to_string(p.Tq) + " Tk=" + std::to_string(p.Tk) +
                          " H=" + std::to_string(p.H) + " D=" + std::to_string(p.D) +
                          " Dv=" + std::to_string(p.Dv));
  }
  if (!p.q || !p.k || !p.v || !p.coef || !p.out) {
    throw InvalidArgument("kway_attention: q, k, v, coef and out must all be set");
  }
  if (!std::isfinite(p.scale)) throw InvalidArgument("kway_attention: scale must be finite");
  for (int m = 0; m < p.maps; ++m) {
    if (!std::isfinite(p.coef[m])) {
      throw InvalidArgument("kway_attention: coef[" + std::to_string(m) + "] is not finite");
    }
  }
}

void expect_shape(const char* name, const Shape& got, const Shape& want, const char* symbols) {
  if (got != want) {
    throw InvalidArgument(std::string("kway_attention: ") + name + " has shape " + shape_str(got) +
                          ", expected " + symbols + " = " + shape_str(want));
  }
}

}  // namespace

KWayParams kway_params(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& coef, int maps, const AttnOptions& opts) {
  if (maps < 1 || maps > 8) {
    throw InvalidArgument("kway_attention: maps must be 1..8, got " + std::to_string(maps));
  }
  if (q.shape.size() != 4 || q.shape[2] % maps != 0) {
    throw InvalidArgument("kway_attention: q has shape " + shape_str(q.shape) +
                          ", expected (B, Tq, maps*H, D) with maps = " + std::to_string(maps));
  }
  KWayParams p;
  p.maps = maps;
  p.B = q.shape[0];
  p.Tq = q.shape[1];
  p.H = q.shape[2] / maps;
  p.D = q.shape[3];
  if (k.shape.size() != 4) {
    throw InvalidArgument("kway_attention: k has shape " + shape_str(k.shape) +
                          ", expected (B, Tk, maps*H, D)");
  }
  p.Tk = k.shape[1];
  expect_shape("k", k.shape, {p.B, p.Tk, maps * p.H, p.D}, "(B, Tk, maps*H, D)");
  if (v.shape.size() != 4) {
    throw InvalidArgument("kway_attention: v has shape " + shape_str(v.shape) +
                          ", expected (B, Tk, H, Dv)");
  }
  p.Dv = v.shape[3];
  expect_shape("v", v.shape, {p.B, p.Tk, p.H, p.Dv}, "(B, Tk, H, Dv)");
  expect_shape("coef", coef.shape, {maps}, "(maps)");
  p.q = q.f32();
  p.k = k.f32();
  p.v = v.f32();
  p.coef = coef.f32();
  p.causal = opts.causal;
  p.scale = opts.scale != 0.0f ? opts.scale : 1.0f / std::sqrt(static_cast<float>(p.D));
  p.mode = opts.mode;
  return p;
}

void kway_attention_ref(const KWayParams& p) {
  check_kway(p);
  const int64_t QH = p.maps * p.H;
  std::vector<double> a(static_cast<size_t>(p.maps * p.Tk)), w(static_cast<size_t>(p.Tk));
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h) {
      for (int64_t i = 0; i < p.Tq; ++i) {
        const int64_t last = p.causal ? i + (p.Tk - p.Tq) : p.Tk - 1;
        const int64_t n = std::clamp<int64_t>(last + 1, 0, p.Tk);
        std::fill(a.begin(), a.end(), 0.0);
        for (int m = 0; m < p.maps; ++m) {
          double* row = &a[static_cast<size_t>(m * p.Tk)];
          const float* qi = p.q + ((b * p.Tq + i) * QH + p.maps * h + m) * p.D;
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < n; ++j) {
            const float* kj = p.k + ((b * p.Tk + j) * QH + p.maps * h + m) * p.D;
            double s = 0;
            for (int64_t d = 0; d < p.D; ++d) s += static_cast<double>(qi[d]) * kj[d];
            row[j] = s * p.scale;
            mx = std::max(mx, row[j]);
          }
          double sum = 0;  // mx is the row max, so exp(s - mx) <= 1
          for (int64_t j = 0; j < n; ++j) sum += std::exp(row[j] - mx);
          for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - mx) / sum;
        }
        double wsum = 0;
        for (int64_t j = 0; j < p.Tk; ++j) {
          double x = 0;
          for (int m = 0; m < p.maps; ++m) x += static_cast<double>(p.coef[m]) * a[m * p.Tk + j];
          if (p.mode == DiffMode::Clamp) x = std::max(x, 0.0);
          w[j] = j < n ? x : 0.0;
          wsum += w[j];
        }
        // Clamp: renormalise; a row that clamps to all zeros stays zero.
        if (p.mode == DiffMode::Clamp) {
          const double inv = wsum > 0 ? 1.0 / wsum : 0.0;
          for (int64_t j = 0; j < p.Tk; ++j) w[j] *= inv;
        }
        float* o = p.out + ((b * p.Tq + i) * p.H + h) * p.Dv;
        for (int64_t d = 0; d < p.Dv; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += w[j] * p.v[((b * p.Tk + j) * p.H + h) * p.Dv + d];
          o[d] = static_cast<float>(acc);
        }
        if (p.probs) {
          for (int m = 0; m < p.maps; ++m) {
            float* dst = p.probs + (((b * p.H + h) * p.maps + m) * p.Tq + i) * p.Tk;
            for (int64_t j = 0; j < p.Tk; ++j) dst[j] = static_cast<float>(a[m * p.Tk + j]);
          }
        }
        if (p.weights) {
          float* dst = p.weights + ((b * p.H + h) * p.Tq + i) * p.Tk;
          for (int64_t j = 0; j < p.Tk; ++j) dst[j] = static_cast<float>(w[j]);
        }
      }
    }
  }
}

}  // namespace diffattn::kernels
