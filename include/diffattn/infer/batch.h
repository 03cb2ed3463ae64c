// A batch of token rows for infer::Session::decode, as llama.cpp's llama_batch: each row a token,
// its position, the sequence it belongs to and whether its logits are wanted. Rows of one
// sequence at consecutive positions form a prompt chunk; a sequence's one row is a decode step.
#pragma once

#include <cstdint>
#include <vector>

namespace diffattn::infer {

struct Batch {
  std::vector<int32_t> tokens;   // (n)
  std::vector<int64_t> pos;      // (n) each row's position in its sequence
  std::vector<int32_t> seq_id;   // (n) a sequence of the session's KvStore
  std::vector<uint8_t> logits;   // (n) 1: the row's logits are wanted (in row order)

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  void clear() {
    tokens.clear();
    pos.clear();
    seq_id.clear();
    logits.clear();
  }
  void add(int32_t token, int64_t position, int32_t seq, bool want_logits) {
    tokens.push_back(token);
    pos.push_back(position);
    seq_id.push_back(seq);
    logits.push_back(want_logits ? 1 : 0);
  }
  // n rows of one sequence: toks[i] at position pos0 + i, the last one's
  // logits wanted (every one's with all_logits).
  void add_chunk(const int32_t* toks, int64_t n, int64_t pos0, int32_t seq, bool all_logits = false) {
    for (int64_t i = 0; i < n; ++i) add(toks[i], pos0 + i, seq, all_logits || i + 1 == n);
  }
  // Rows whose logits are wanted: decode's logits hold this many rows of V.
  int64_t n_logits() const {
    int64_t n = 0;
    for (const uint8_t f : logits) n += f != 0;
    return n;
  }
};

}  // namespace diffattn::infer
