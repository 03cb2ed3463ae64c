// The generation loop (generate.h): a prompt's prefill and one decode step per new token
// through a Session over a contiguous store, sampled by a Sampler.
#include "diffattn/infer/generate.h"

#include <algorithm>
#include <string>

#include "diffattn/base/error.h"
#include "diffattn/infer/session.h"

namespace diffattn::infer {

std::vector<int32_t> generate_ids(const model::Model& m, const std::vector<int32_t>& ids,
                                  const GenerateOptions& o,
                                  const std::function<bool(int32_t)>& on_token) {
  if (o.max_new < 0) {
    throw InvalidArgument("generate: max_new must be >= 0, got " + std::to_string(o.max_new));
  }
  const int64_t V = m.config().vocab_size, cap = m.config().max_seq_len;
  if (ids.empty()) throw InvalidArgument("generate: the prompt has no tokens");
  if (static_cast<int64_t>(ids.size()) >= cap) {
    throw InvalidArgument("generate: the prompt has " + std::to_string(ids.size()) +
                          " tokens, the model's max_seq_len is " + std::to_string(cap) +
                          " (the prompt and at least one new token must fit)");
  }
  const int64_t n_new = std::min<int64_t>(o.max_new, cap - static_cast<int64_t>(ids.size()));
  std::vector<int32_t> out;
  if (n_new == 0) return out;
  const int64_t P = static_cast<int64_t>(ids.size());
  infer::KvStore kv(m, infer::KvStore::Contiguous{P + n_new}, o.kv_dtype);
  infer::Session session(m, kv);
  Sampler sampler(o.sampler);
  std::vector<float> logits(static_cast<size_t>(V));
  infer::Batch batch;
  batch.add_chunk(ids.data(), P, 0, 0);
  session.decode(batch, logits.data());
  for (int64_t i = 0; i < n_new; ++i) {
    const int32_t next = sampler.sample(logits.data(), V);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) break;
    out.push_back(next);
    if (on_token && !on_token(next)) break;
    if (i + 1 < n_new) {
      batch.clear();
      batch.add(next, P + i, 0, true);
      session.decode(batch, logits.data());
    }
  }
  return out;
}

}  // namespace diffattn::infer
