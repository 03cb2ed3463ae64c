// A k-way split of attention, reference only: out = sum_m c_m softmax(s Q_m K_m^T) V over
// `maps` maps (the textbook's Exercise 3: A1 - lambda1 A2 - lambda2 A3 is c = (1, -l1, -l2)).
// With maps = 2 and c = (1, -lambda) it is differential attention (arXiv:2410.05258, Eq. 1);
// with maps = 1 and c = (1), standard attention. A study tool beside the operator family in
// attention.h, which it does not change: no GQA, no strides, plain loops in double.
#pragma once

#include <cstdint>

#include "diffattn/kernels/attention.h"

namespace diffattn::kernels {

struct KWayParams {
  int64_t B = 0, Tq = 0, Tk = 0;
  int64_t H = 0;       // heads, each combining `maps` maps over shared values
  int64_t D = 0, Dv = 0;
  int maps = 0;        // 1..8
  bool causal = false; // query i sees key j iff j <= i + (Tk - Tq)
  float scale = 0.0f;  // multiplies q.k; 0 means 1/sqrt(D)
  DiffMode mode = DiffMode::Signed;  // clamp: max(sum_m c_m A_m, 0) renormalised per row

  const float* q = nullptr;     // (B, Tq, maps*H, D): map m of head h is sub-head maps*h + m
  const float* k = nullptr;     // (B, Tk, maps*H, D)
  const float* v = nullptr;     // (B, Tk, H, Dv)
  const float* coef = nullptr;  // (maps): c_m; finite

  float* out = nullptr;      // (B, Tq, H, Dv)
  float* probs = nullptr;    // optional (B, H, maps, Tq, Tk): each map's softmax, 0 where masked
  float* weights = nullptr;  // optional (B, H, Tq, Tk): the combined weights applied to V
};

// Builds and validates the params from the caller's tensors (q (B, Tq, maps*H, D), k (B, Tk,
// maps*H, D), v (B, Tk, H, Dv), coef (maps)); throws InvalidArgument naming the tensor, the
// expected and the actual shape. Output pointers are left null.
KWayParams kway_params(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& coef, int maps, const AttnOptions& opts);

// The forward, plain loops with double accumulation. Checks the params first.
void kway_attention_ref(const KWayParams& p);

}  // namespace diffattn::kernels
