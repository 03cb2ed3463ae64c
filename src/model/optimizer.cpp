// AdamW (Loshchilov & Hutter) with decoupled weight decay, global-norm gradient clipping and a
// warmup + cosine learning-rate schedule. Sums for the norm run in double over the flat
// buffer in order, so they do not depend on threads; updates are element-wise.
#include <cmath>
#include <string>

#include "diffattn/base/error.h"

#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/optimizer.h"
#include "diffattn/nn/layers.h"

namespace diffattn::model {

double lr_at(const AdamWOptions& o, int64_t step) {
  if (o.warmup > 0 && step < o.warmup) {
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  }
  const int64_t span = o.total_steps - o.warmup;
  if (span <= 0) return o.lr;
  double frac = static_cast<double>(step - o.warmup) / static_cast<double>(span);
  frac = std::min(1.0, std::max(0.0, frac));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * frac));
}

double grad_norm(const std::vector<float>& g) {
  double s = 0;
  for (float x : g) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

void AdamW::reset(size_t n) {
  m.assign(n, 0.0f);
  v.assign(n, 0.0f);
  t = 0;
}

double AdamW::step(Model& model, const std::vector<float>& grads, const AdamWOptions& o,
                   double lr) {
  const std::span<float> P = model.params();
  if (grads.size() != P.size()) {
    throw InvalidArgument("AdamW::step: " + std::to_string(grads.size()) + " gradients for " +
                          std::to_string(P.size()) + " weights");
  }
  if (m.size() != P.size()) reset(P.size());
  const double norm = grad_norm(grads);
  const float clip = (o.clip > 0 && norm > o.clip) ? static_cast<float>(o.clip / norm) : 1.0f;
  ++t;
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  const float b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2);
  const float step = static_cast<float>(lr / bc1), eps = static_cast<float>(o.eps);
  const float rbc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  for (const TensorInfo& ti : model.tensors()) {
    const float decay = ti.decay ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
    float* p = P.data() + ti.offset;
    const float* g = grads.data() + ti.offset;
    float* mm = m.data() + ti.offset;
    float* vv = v.data() + ti.offset;
#pragma omp parallel for schedule(static) if (ti.numel >= nn::kParallelMin)
    for (int64_t i = 0; i < ti.numel; ++i) {
      const float gi = g[i] * clip;
      mm[i] = b1 * mm[i] + (1.0f - b1) * gi;
      vv[i] = b2 * vv[i] + (1.0f - b2) * gi * gi;
      // p <- p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)
      p[i] = p[i] * decay - step * mm[i] / (std::sqrt(vv[i]) * rbc2 + eps);
    }
  }
  return norm;
}

}  // namespace diffattn::model
