// Sampling the next token: temperature, top-k, top-p (nucleus), seeded; temperature 0 is
// greedy (the first maximum wins ties).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "diffattn/base/error.h"
#include "diffattn/infer/sampler.h"

namespace diffattn::infer {

Sampler::Sampler(const SamplerOptions& o) : o_(o), rng_(o.seed) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw InvalidArgument("sampler: temperature must be >= 0, got " + std::to_string(o.temperature));
  }
  if (o.top_k < 0) throw InvalidArgument("sampler: top_k must be >= 0, got " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    throw InvalidArgument("sampler: top_p must be in (0, 1], got " + std::to_string(o.top_p));
  }
  if (o.vocab_limit < 0) {
    throw InvalidArgument("sampler: vocab_limit must be >= 0, got " + std::to_string(o.vocab_limit));
  }
  for (size_t i = 0; i < o.excluded.size(); ++i) {
    if (o.excluded[i] < 0 || (i > 0 && o.excluded[i] <= o.excluded[i - 1])) {
      throw InvalidArgument("sampler: excluded ids must be increasing ids >= 0");
    }
  }
  for (const double pen : {o.presence_penalty, o.frequency_penalty}) {
    if (!(pen >= -2 && pen <= 2)) {
      throw InvalidArgument("sampler: presence and frequency penalties must be in [-2, 2], got " +
                            std::to_string(pen));
    }
  }
  for (size_t i = 0; i < o.logit_bias.size(); ++i) {
    const auto& [id, b] = o.logit_bias[i];
    if (id < 0 || (i > 0 && id <= o.logit_bias[i - 1].first) || !(b >= -100 && b <= 100)) {
      throw InvalidArgument("sampler: logit_bias must hold increasing ids >= 0 with biases in [-100, 100]");
    }
  }
}

// Without a top-k or top-p limit every token is a candidate and no order is needed: the draw
// walks the tokens by index. With a limit, the candidates are walked from the highest logit
// down (ties by index), and only as many are put in that order as the limit needs: the top k
// by a partial sort, the nucleus by a partial sort of a prefix that grows until it holds top_p
// of the mass (a full sort of a 128K vocabulary per token cost more than the model's step at
// 16 streams).
int32_t Sampler::sample(const float* logits, int64_t V, const uint8_t* allowed) {
  const int32_t id = draw(logits, V, allowed);
  if (o_.presence_penalty != 0 || o_.frequency_penalty != 0) {
    if (count_.size() <= static_cast<size_t>(id)) count_.resize(static_cast<size_t>(id) + 1, 0);
    if (count_[static_cast<size_t>(id)]++ == 0) seen_.push_back(id);
  }
  return id;
}

int32_t Sampler::draw(const float* logits, int64_t V, const uint8_t* allowed) {
  // Only the ids that may be drawn: the first vocab_limit, the excluded and the masked ones at
  // -inf (a weight of exp(-inf) = 0, never the argmax while any other id is finite). The logits
  // are copied only when something changes them.
  if (o_.vocab_limit > 0) V = std::min(V, o_.vocab_limit);
  const bool penalize = !seen_.empty() && (o_.presence_penalty != 0 || o_.frequency_penalty != 0);
  if (!o_.excluded.empty() || !o_.logit_bias.empty() || penalize || allowed != nullptr) {
    masked_.assign(logits, logits + V);
    for (const auto& [id, b] : o_.logit_bias) {
      if (id < V) masked_[static_cast<size_t>(id)] += b;
    }
    if (penalize) {
      for (const int32_t id : seen_) {
        if (id >= V) continue;
        const int32_t c = count_[static_cast<size_t>(id)];
        masked_[static_cast<size_t>(id)] -=
            static_cast<float>(c * o_.frequency_penalty + o_.presence_penalty);
      }
    }
    constexpr float kNeg = -std::numeric_limits<float>::infinity();
    for (int32_t id : o_.excluded) {
      if (id < V) masked_[static_cast<size_t>(id)] = kNeg;
    }
    if (allowed != nullptr) {
      for (int64_t i = 0; i < V; ++i) {
        if (allowed[i] == 0) masked_[static_cast<size_t>(i)] = kNeg;
      }
    }
    logits = masked_.data();
  }
  last_ = logits;
  last_v_ = V;
  if (o_.temperature == 0.0) {
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  }
  const size_t nv = static_cast<size_t>(V);
  const double mx = *std::max_element(logits, logits + V), T = o_.temperature;
  if (o_.top_k == 0 && o_.top_p >= 1.0) {
    p_.resize(nv);
    double z = 0;
    for (size_t i = 0; i < nv; ++i) z += (p_[i] = std::exp((logits[i] - mx) / T));
    const double u = rng_.uniform() * z;  // the library's RNG: the same draw everywhere
    double c = 0;
    size_t last = 0;  // the last token with any probability (u == z after rounding)
    for (size_t i = 0; i < nv; ++i) {
      if (p_[i] == 0) continue;
      c += p_[i];
      last = i;
      if (u < c) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(last);
  }
  // Highest logits first; ties by index, so the order is fully determined.
  const auto before = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  idx_.resize(nv);
  std::iota(idx_.begin(), idx_.end(), 0);
  size_t n;  // candidates: idx_[0, n) in order, their weights w_[0, n)
  double z = 0;
  if (o_.top_k > 0) {
    n = std::min(nv, static_cast<size_t>(o_.top_k));
    std::partial_sort(idx_.begin(), idx_.begin() + static_cast<std::ptrdiff_t>(n), idx_.end(), before);
    w_.resize(n);
    for (size_t i = 0; i < n; ++i) z += (w_[i] = std::exp((logits[idx_[i]] - mx) / T));
    if (o_.top_p < 1.0) {
      double c = 0;
      for (size_t i = 0; i < n; ++i) {
        c += w_[i] / z;
        if (c >= o_.top_p) {
          n = i + 1;
          break;
        }
      }
      z = 0;
      for (size_t i = 0; i < n; ++i) z += w_[i];
    }
  } else {
    // The nucleus: the mass of every token, then the shortest prefix in order holding top_p
    // of it (a prefix of 64 candidates first, 16x more while that is not enough).
    p_.resize(nv);
    double all = 0;
    for (size_t i = 0; i < nv; ++i) all += (p_[i] = std::exp((logits[i] - mx) / T));
    size_t k = std::min<size_t>(nv, 64);
    n = 0;
    while (n == 0) {
      std::partial_sort(idx_.begin(), idx_.begin() + static_cast<std::ptrdiff_t>(k), idx_.end(), before);
      double c = 0;
      for (size_t i = 0; i < k; ++i) {
        c += p_[static_cast<size_t>(idx_[i])] / all;
        if (c >= o_.top_p) {
          n = i + 1;
          break;
        }
      }
      if (n == 0 && k == nv) n = nv;  // rounding kept the sum under top_p: every token
      k = std::min(nv, k * 16);
    }
    w_.resize(n);
    for (size_t i = 0; i < n; ++i) z += (w_[i] = p_[static_cast<size_t>(idx_[i])]);
  }
  const double u = rng_.uniform() * z;  // the library's RNG: the same draw everywhere
  double c = 0;
  for (size_t i = 0; i < n; ++i) {
    c += w_[i];
    if (u < c) return idx_[i];
  }
  return idx_[n - 1];
}

}  // namespace diffattn::infer
