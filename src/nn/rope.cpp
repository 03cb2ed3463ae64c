// Rotary position embedding with interleaved pairs (docs/FORMAT.md): pair (2j, 2j+1) of every
// query and key (sub-)head rotates by t * theta_j, theta_j = base^(-2j/D). The rotation is
// orthogonal, so the backward is the same rotation by the negative angle.
#include <cmath>
#include <string>

#include "diffattn/nn/layers.h"

namespace diffattn::nn {

const char* rope_type_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::None: return "default";
    case RopeScaling::Type::Linear: return "linear";
    case RopeScaling::Type::Llama3: return "llama3";
  }
  return "?";
}

std::vector<double> rope_inv_freq(int64_t D, double base, const RopeScaling& sc) {
  if (D % 2 != 0) throw InvalidArgument("rope: head size D = " + std::to_string(D) + " is odd");
  const int64_t half = D / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    double theta = std::pow(base, -2.0 * static_cast<double>(j) / static_cast<double>(D));
    if (sc.type == RopeScaling::Type::Linear) {
      theta /= sc.factor;
    } else if (sc.type == RopeScaling::Type::Llama3) {
      const double L = static_cast<double>(sc.original_max_position_embeddings);
      const double wavelen = 2.0 * M_PI / theta;
      if (wavelen > L / sc.low_freq_factor) {
        theta /= sc.factor;  // low frequencies: stretched to the long context
      } else if (wavelen >= L / sc.high_freq_factor) {
        // between: blend the stretched and the original frequency
        const double s = (L / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
        theta = (1.0 - s) * theta / sc.factor + s * theta;
      }
    }
    f[static_cast<size_t>(j)] = theta;
  }
  return f;
}

void rope_table(float* cos_t, float* sin_t, int64_t pos0, int64_t T, int64_t D,
                const std::vector<double>& inv_freq) {
  const int64_t half = D / 2;
  if (static_cast<int64_t>(inv_freq.size()) != half) {
    throw InvalidArgument("rope: " + std::to_string(inv_freq.size()) +
                          " frequencies for head size D = " + std::to_string(D));
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      // Angles in double: t * theta_j reaches thousands of radians at long context, where a
      // float angle would lose its low bits before cos/sin see it.
      const double a = static_cast<double>(pos0 + t) * inv_freq[static_cast<size_t>(j)];
      cos_t[t * half + j] = static_cast<float>(std::cos(a));
      sin_t[t * half + j] = static_cast<float>(std::sin(a));
    }
  }
}

void rope_table(float* cos_t, float* sin_t, int64_t pos0, int64_t T, int64_t D, double base) {
  rope_table(cos_t, sin_t, pos0, T, D, rope_inv_freq(D, base));
}

void rope_apply(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T,
                int64_t nh, int64_t D, int64_t ld, int64_t lb, bool inverse) {
  const int64_t half = D / 2;
  const float sgn = inverse ? -1.0f : 1.0f;
#pragma omp parallel for collapse(2) schedule(static) if (B * T * nh * D >= kParallelMin)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      float* row = x + b * lb + t * ld;
      const float* c = cos_t + t * half;
      const float* s = sin_t + t * half;
      for (int64_t h = 0; h < nh; ++h) {
        float* u = row + h * D;
        for (int64_t j = 0; j < half; ++j) {
          const float u0 = u[2 * j], u1 = u[2 * j + 1], sj = sgn * s[j];
          u[2 * j] = u0 * c[j] - u1 * sj;
          u[2 * j + 1] = u0 * sj + u1 * c[j];
        }
      }
    }
  }
}

}  // namespace diffattn::nn
