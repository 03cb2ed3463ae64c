// Token embedding: a row gather forward, a scatter-add backward (serial, since tokens repeat
// and the order of additions must not depend on threads).
#include <cstring>
#include <string>

#include "diffattn/nn/layers.h"

namespace diffattn::nn {

void embedding_fwd(float* out, const int32_t* tokens, const float* table, int64_t N, int64_t C,
                   int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      throw InvalidArgument("embedding: token " + std::to_string(tokens[i]) + " at position " +
                            std::to_string(i) + " is outside the vocabulary [0, " +
                            std::to_string(V) + ")");
    }
    std::memcpy(out + i * C, table + static_cast<int64_t>(tokens[i]) * C,
                sizeof(float) * static_cast<size_t>(C));
  }
}

void embedding_bwd(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                   int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    float* row = dtable + static_cast<int64_t>(tokens[i]) * C;
    const float* d = dout + i * C;
    for (int64_t c = 0; c < C; ++c) row[c] += d[c];
  }
}

}  // namespace diffattn::nn
