// Token masks for constrained decoding: which token ids may come next in a Matcher's state
// (diffattn/grammar/json_schema.h), for any tokenizer given as the bytes of each id. Built once
// per tokenizer (a byte trie of the vocabulary), then each mask walks that trie with the
// automaton, pruning every branch the grammar refuses at its first refused byte. Inside a plain
// string, where most of a vocabulary is allowed, the tokens of ordinary characters come from a
// table prepared at construction and only the others are walked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diffattn/grammar/json_schema.h"

namespace diffattn::grammar {

class TokenMasker {
 public:
  // token_bytes[id]: the bytes token id adds to the text; "" for an id that is not text (a
  // special or control token, a hole in the ids): such ids are never allowed. eos_ids: the
  // end-of-sequence ids, allowed exactly when the document is complete (whatever their bytes).
  TokenMasker(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids);
  TokenMasker(TokenMasker&&) noexcept;
  TokenMasker& operator=(TokenMasker&&) noexcept;
  ~TokenMasker();

  int64_t vocab_size() const;
  // mask (resized to vocab_size): 1 where the token may come next in m's state, else 0.
  // Safe to call from several threads at once.
  void allowed(const Matcher& m, std::vector<uint8_t>& mask) const;
  // Advances m by token id (an end-of-sequence id ends the document). False, with m unchanged,
  // when the token is not allowed (an id outside the vocabulary included).
  bool advance(Matcher& m, int32_t id) const;
  bool is_eos(int32_t id) const;
  // The number of nodes of the vocabulary trie (for the record).
  size_t trie_nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace diffattn::grammar
