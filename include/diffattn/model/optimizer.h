// AdamW with decoupled weight decay, global-norm clipping and the warmup + cosine schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "diffattn/model/model.h"

namespace diffattn::model {

struct AdamWOptions {
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 10, total_steps = 100;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double clip = 1.0;  // global gradient-norm clip; 0 turns it off
};

// Learning rate at step (0-based): linear warmup to lr over `warmup` steps, then cosine decay
// to min_lr at total_steps.
double lr_at(const AdamWOptions& o, int64_t step);

struct AdamW {
  std::vector<float> m, v;  // first and second moments, laid out like Model::params
  int64_t t = 0;            // updates taken
  void reset(size_t n);
  // Clips grads (laid out like m.params: a TrainContext's) to o.clip (global L2 norm, summed in
  // double in a fixed order), then takes one decoupled-weight-decay step on m.params. Returns
  // the gradient norm before clipping.
  double step(Model& m, const std::vector<float>& grads, const AdamWOptions& o, double lr);
};

double grad_norm(const std::vector<float>& g);

}  // namespace diffattn::model
