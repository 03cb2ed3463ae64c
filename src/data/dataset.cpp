// Datasets: random training windows addressed by a counter (so the data position of a run is
// one number), and validation loss over consecutive windows.
#include <string>

#include "diffattn/base/rng.h"
#include "diffattn/data/data.h"

namespace diffattn::data {

TokenWindows::TokenWindows(std::vector<int32_t> tokens, uint64_t seed, std::string name)
    : tokens_(std::move(tokens)), seed_(seed), name_(std::move(name)) {}

void TokenWindows::batch(uint64_t index, int64_t B, int64_t T, int32_t* tokens,
                         int32_t* targets) const {
  const int64_t n = static_cast<int64_t>(tokens_.size());
  if (n < T + 1) {
    throw InvalidArgument("dataset " + name_ + ": " + std::to_string(n) +
                          " tokens, too few for windows of T + 1 = " + std::to_string(T + 1));
  }
  const uint64_t starts = static_cast<uint64_t>(n - T);
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t h =
        mix64(mix64(seed_ + kGolden64 * (index + 1)) ^ static_cast<uint64_t>(b));
    const int64_t s = static_cast<int64_t>(h % starts);
    for (int64_t t = 0; t < T; ++t) {
      tokens[b * T + t] = tokens_[static_cast<size_t>(s + t)];
      targets[b * T + t] = tokens_[static_cast<size_t>(s + t + 1)];
    }
  }
}

std::string TokenWindows::describe() const {
  return name_ + " (" + std::to_string(tokens_.size()) + " tokens, random windows)";
}

double eval_loss(model::TrainContext& run, const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                 int64_t max_batches) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t windows = n > T ? (n - 1) / T : 0;
  if (windows < 1) {
    throw InvalidArgument("eval: " + std::to_string(n) + " validation tokens, too few for one window of T + 1 = " +
                          std::to_string(T + 1));
  }
  std::vector<int32_t> tok(static_cast<size_t>(B * T)), tgt(tok.size());
  double sum = 0;
  int64_t scored = 0;
  for (int64_t w0 = 0; w0 < windows && (max_batches <= 0 || w0 / B < max_batches); w0 += B) {
    const int64_t nb = std::min(B, windows - w0);
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t s = (w0 + b) * T;
      for (int64_t t = 0; t < T; ++t) {
        tok[static_cast<size_t>(b * T + t)] = tokens[static_cast<size_t>(s + t)];
        tgt[static_cast<size_t>(b * T + t)] = tokens[static_cast<size_t>(s + t + 1)];
      }
    }
    sum += run.forward(tok.data(), tgt.data(), nb, T) * static_cast<double>(nb * T);
    scored += nb * T;
  }
  return sum / static_cast<double>(scored);
}

}  // namespace diffattn::data
