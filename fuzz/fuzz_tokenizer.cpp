// Fuzzes the tokenizers (src/data/tokenizer.cpp). The first byte chooses: 's' reads the rest as a
// SentencePiece model file in memory (parse_sentencepiece) and, when it loads, encodes and
// decodes a fixed text and a few ids; anything else runs the byte tokenizer on the rest, whose
// encode then decode must give the input back. Errors must be diffattn::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "diffattn/data/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] == 's') {
      const auto tok = diffattn::data::parse_sentencepiece(rest, "fuzz/tokenizer.model");
      const int64_t V = tok->vocab_size();
      if (V < 1) std::abort();
      const std::vector<int32_t> ids = tok->encode("In the beginning God created the heaven and the earth.");
      for (int32_t id : ids) {
        if (id < 0 || id >= V) std::abort();
      }
      (void)tok->decode(ids);
      (void)tok->decode({0, static_cast<int32_t>(V - 1), static_cast<int32_t>(V / 2)});
    } else {
      const auto tok = diffattn::data::byte_tokenizer();
      if (tok->decode(tok->encode(rest)) != rest) std::abort();
    }
  } catch (const diffattn::Error&) {
  }
  return 0;
}
