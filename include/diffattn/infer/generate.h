// The generation loop: one sequence's prompt prefilled and then decoded a token at a time
// through an infer::Session over a contiguous KvStore, each token drawn by a Sampler. generate
// (train/train.h: text in and out), the CLI, the explorer and Python run it; the server's
// continuous-batching scheduler (scheduler.h) runs many sequences through one Session.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/infer/sampler.h"
#include "diffattn/model/model.h"

namespace diffattn::infer {

struct GenerateOptions {
  int64_t max_new = 200;  // new tokens; fewer if the model's max_seq_len is reached
  SamplerOptions sampler;
  std::vector<int32_t> stop_ids;  // generation ends at any of these (not part of the output)
  DType kv_dtype = DType::F32;  // the KV cache's storage (F32, BF16 or F16)
};

// Prefills prompt ids through the KV cache, then decodes one token at a time; on_token (if
// given) sees each new id and may return false to stop. Returns the new ids (without a stop id).
std::vector<int32_t> generate_ids(const model::Model& m, const std::vector<int32_t>& prompt,
                                  const GenerateOptions& o,
                                  const std::function<bool(int32_t)>& on_token = {});

}  // namespace diffattn::infer
