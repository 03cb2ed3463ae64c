// Bias addition for the layers whose checkpoints carry biases (Hugging Face attention_bias and
// mlp_bias); the typed-weight products themselves are in linear_lowp.cpp.
#include "diffattn/nn/layers.h"

namespace diffattn::nn {

void bias_add(float* out, const float* bias, int64_t N, int64_t OC, int64_t ldo) {
  const int64_t ld = ldo ? ldo : OC;
  for (int64_t i = 0; i < N; ++i) {
    float* row = out + i * ld;
    for (int64_t j = 0; j < OC; ++j) row[j] += bias[j];
  }
}

}  // namespace diffattn::nn
