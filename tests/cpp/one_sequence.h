// One sequence's contiguous KV cache and the session over it, fed as Model::infer was (removed:
// inference runs only through infer::Session): infer(tokens, n, logits) appends n tokens and
// writes the logits of the last one. What the model tests use as their cached-inference side.
#pragma once

#include <cstdint>

#include "diffattn/base/dtype.h"
#include "diffattn/infer/batch.h"
#include "diffattn/infer/kv_store.h"
#include "diffattn/infer/session.h"
#include "diffattn/model/model.h"

namespace diffattn::testing {

class OneSequence {
 public:
  OneSequence(const model::Model& m, int64_t capacity, DType kv_dtype = DType::F32)
      : kv_(m, infer::KvStore::Contiguous{capacity}, kv_dtype), session_(m, kv_) {}
  void infer(const int32_t* tokens, int64_t n, float* logits_last) {
    batch_.clear();
    if (n == 1) {
      batch_.add(tokens[0], len_, 0, true);
    } else {
      batch_.add_chunk(tokens, n, len_, 0);
    }
    session_.decode(batch_, logits_last);
    len_ += n;
  }
  int64_t len() const { return kv_.seq(0).len; }

 private:
  infer::KvStore kv_;
  infer::Session session_;
  infer::Batch batch_;
  int64_t len_ = 0;
};

}  // namespace diffattn::testing
