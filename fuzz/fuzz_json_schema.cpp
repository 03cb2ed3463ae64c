// Fuzzes constrained output (src/grammar) with schemas as outside input: the bytes up to the
// first NUL are a schema's JSON text ("J" alone: json_object), the rest a byte stream fed to its
// matcher. Compiling either succeeds or throws diffattn::InvalidArgument (SchemaError and
// UnsupportedSchema with a keyword and path); it never crashes, hangs or allocates without bound
// (docs/SECURITY.md). Feeding checks the matcher's promises on every byte: advance takes a byte
// exactly when allowed_bytes says so; a state that is not a complete document always has a byte
// to go on with; whatever it calls complete parses as JSON; a toy vocabulary's mask is what
// trying every token says.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "diffattn/grammar/json_schema.h"
#include "diffattn/grammar/token_mask.h"

namespace {

std::vector<std::string> toy_vocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"{\"", "\":", "\": ", "\", \"", "\"}", "]}", "true", "null", "12", "3.5", "\\u00", "\\ud83d",
                        "\xC3", "\xA9", "\xC3\xA9", "abc", ", ", "[]", "{}", "\"\"", "aaaaaaaaaa"}) {
    v.emplace_back(t);
  }
  v.emplace_back("");  // the end of sequence
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace diffattn::grammar;
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string schema = in.substr(0, nul);
  const std::string stream = nul == std::string::npos ? std::string() : in.substr(nul + 1);
  static const std::vector<std::string> vocab = toy_vocab();
  static const TokenMasker masker(vocab, {static_cast<int32_t>(vocab.size() - 1)});

  std::optional<Grammar> g;
  try {
    g = schema == "J" ? Grammar::json_object() : Grammar::json_schema_text(schema);
  } catch (const SchemaError& e) {
    if (std::string(e.what()).empty()) std::abort();
    return 0;
  } catch (const diffattn::InvalidArgument&) {
    return 0;
  }
  Matcher m(*g);
  std::string taken;
  std::vector<uint8_t> mask;
  // At most 4,000 bytes of stream; the first 64 checked against all 256 bytes and the first 8
  // against every token of the toy vocabulary: bounded work per input.
  for (size_t i = 0; i < stream.size() && i < 4000; ++i) {
    const auto c = static_cast<uint8_t>(stream[i]);
    const bool full = i < 64;
    const std::bitset<256> allowed = full ? m.allowed_bytes() : std::bitset<256>();
    if (full && allowed.none() && !m.accepts_end()) std::abort();  // a dead end
    if (i < 8) {
      masker.allowed(m, mask);
      for (size_t id = 0; id < vocab.size(); ++id) {
        Matcher c = m;
        const bool want = id + 1 == vocab.size() ? m.accepts_end() : c.advance(vocab[id]);
        if ((mask[id] != 0) != want) std::abort();
      }
    }
    // Bytes the stream offers that the matcher refuses are skipped: a walk of allowed bytes.
    const bool ok = m.advance(std::string_view(&stream[i], 1));
    if (full && ok != allowed[c]) std::abort();
    if (ok) taken += static_cast<char>(c);
    if (m.accepts_end()) {
      try {
        (void)nlohmann::json::parse(taken);
      } catch (const nlohmann::json::exception&) {
        std::abort();  // a "complete document" that is not JSON
      }
    }
  }
  return 0;
}
