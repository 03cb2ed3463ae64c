// Fuzzes the Hugging Face tokenizer.json reader and its encoder. An input that starts with '{'
// is a tokenizer.json: it loads or throws a diffattn::Error; a file that loads has one string
// per id and one id per string (an added token never takes another token's id), and encodes.
// Any other input is a text for a
// fixed byte-level BPE tokenizer (every byte, chained merges, an added token): valid UTF-8
// must encode, and decode back to exactly itself; invalid UTF-8 must throw InvalidArgument.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "diffattn/base/error.h"
#include "diffattn/data/hf_tokenizer.h"

namespace {

const diffattn::data::HfTokenizer& fixed() {
  static const diffattn::data::HfTokenizer t = [] {
    std::string vocab, esc;
    for (int b = 0; b < 256; ++b) {
      const std::string c = diffattn::data::hf_byte_char(b);
      esc.clear();
      for (char ch : c) {
        if (ch == '"' || ch == '\\') esc.push_back('\\');
        esc.push_back(ch);
      }
      vocab += "\"" + esc + "\": " + std::to_string(b) + ", ";
    }
    vocab += "\"ab\": 256, \"abab\": 257, \"\\u0120a\": 258, \"aa\": 259, \"aaaa\": 260";
    const std::string json =
        "{\"added_tokens\": [{\"id\": 261, \"content\": \"<|x|>\", \"special\": true}], "
        "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, "
        "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {" +
        vocab + "}, \"merges\": [\"a b\", \"ab ab\", \"\\u0120 a\", \"a a\", \"aa aa\"]}}";
    return diffattn::data::HfTokenizer::from_json(json, "fixed");
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!text.empty() && text[0] == '{') {
    try {
      const diffattn::data::HfTokenizer t = diffattn::data::HfTokenizer::from_json(text, "fuzz/tokenizer.json");
      (void)t.decode(t.encode("Hello, world! 123 \xc3\xa9", true));
      for (int32_t id = 0; id < t.vocab_size() && id < 4096; ++id) {
        const std::string& s = t.token(id);
        if (!s.empty() && t.id_of(s) != id) std::abort();  // two ids for one string, or the reverse
      }
    } catch (const diffattn::Error&) {
    }
    return 0;
  }
  const diffattn::data::HfTokenizer& t = fixed();
  std::vector<int32_t> ids;
  try {
    ids = t.encode(text, false);
  } catch (const diffattn::InvalidArgument&) {
    return 0;  // invalid UTF-8: refused with a message
  }
  if (t.decode(ids) != text) std::abort();  // byte-level BPE loses nothing
  return 0;
}
