// Token-mask timing (docs/serving.md, "Constrained output"): builds the mask tables of a
// tokenizer.json vocabulary once, then times TokenMasker::allowed in typical states of a
// document. Prints, per state, the number of allowed tokens and the time per mask (best and
// median of the repeats; machines shared with other work make single timings noisy).
//   bench_grammar [TOKENIZER_DIR_OR_JSON] [REPEATS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "diffattn/data/data.h"
#include "diffattn/grammar/json_schema.h"
#include "diffattn/grammar/token_mask.h"
#include "grammar/program.h"

using namespace diffattn;
using namespace diffattn::grammar;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "../shared/data/tokenizers/llama3";
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 50;
  const auto tok = data::load_hf_tokenizer(path);
  std::vector<std::string> bytes;
  for (int32_t id = 0; id < tok->vocab_size(); ++id) bytes.push_back(tok->token_bytes(id));
  std::vector<int32_t> eos;
  if (tok->eos_id() >= 0) eos.push_back(tok->eos_id());
  const auto t0 = Clock::now();
  const TokenMasker masker(bytes, eos);
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("%s: %lld tokens, trie of %zu nodes, tables built in %.0f ms\n", path.c_str(),
              static_cast<long long>(masker.vocab_size()), masker.trie_nodes(), build_ms);

  const Grammar any = Grammar::json_object();
  const Grammar color = Grammar::json_schema_text(
      R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]}},"required":["color"],"additionalProperties":false})");
  const Grammar nested = Grammar::json_schema_text(
      R"({"type":"object","properties":{"id":{"type":"integer","minimum":0,"maximum":999},"name":{"type":"string","maxLength":8},"tags":{"type":"array","items":{"type":"string"}},"ok":{"type":"boolean"}},"required":["id","name","tags","ok"],"additionalProperties":false})");
  struct State {
    const char* what;
    const Grammar* g;
    const char* prefix;
  };
  const State states[] = {
      {"json_object: start", &any, ""},
      {"json_object: a name", &any, "{\""},
      {"json_object: a value after ': '", &any, "{\"a\": "},
      {"json_object: in a string value", &any, "{\"a\": \"hello wor"},
      {"json_object: after '\\' in a string", &any, "{\"a\": \"x\\"},
      {"json_object: inside a UTF-8 character", &any, "{\"a\": \"\xE6\x97"},
      {"json_object: in a number", &any, "{\"a\": 12"},
      {"json_object: after a value", &any, "{\"a\": [1, {\"b\": null}]"},
      {"enum object: start", &color, ""},
      {"enum object: the enum value", &color, "{\"color\": \""},
      {"nested: integer in range", &nested, "{\"id\":4"},
      {"nested: string of maxLength 8", &nested, "{\"id\":4,\"name\":\"ab"},
      {"nested: array of strings", &nested, "{\"id\":4,\"name\":\"ab\",\"tags\":[\"x\", "},
      {"nested: a name to come", &nested, "{\"id\":4,\"name\":\"ab\",\"tags\":[], \""},
  };
  std::printf("%-40s %9s %9s %9s\n", "state", "allowed", "best ms", "median ms");
  std::vector<uint8_t> mask;
  for (const State& s : states) {
    Matcher m(*s.g);
    if (!m.advance(s.prefix)) {
      std::printf("%-40s the prefix is refused\n", s.what);
      return 1;
    }
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      const auto a = Clock::now();
      masker.allowed(m, mask);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
    }
    std::sort(ms.begin(), ms.end());
    long long n = 0;
    for (uint8_t x : mask) n += x;
    std::printf("%-40s %9lld %9.3f %9.3f\n", s.what, n, ms.front(), ms[ms.size() / 2]);
  }
  // The worst kind of schema for this automaton: alternatives that stay ambiguous level after
  // level, so that parses multiply up to kMaxParses, each with a deep stack.
  const Grammar ambiguous = Grammar::json_schema_text(R"({"anyOf":[
      {"type":"object","properties":{"a":{"$ref":"#"}},"additionalProperties":false},
      {"type":"object","properties":{"a":{"$ref":"#"},"b":{"type":"integer"}},"additionalProperties":false},
      {"type":"object","properties":{"a":{"anyOf":[{"$ref":"#"},{"type":"null"}]}}}]})");
  Matcher m(ambiguous);
  for (int level = 1; level <= 30; ++level) {
    if (!m.advance("{\"a\":")) break;
    if (level % 5 != 0) continue;
    std::vector<double> ms;
    for (int r = 0; r < std::max(3, repeats / 10); ++r) {
      const auto a = Clock::now();
      masker.allowed(m, mask);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("ambiguous anyOf, %2d levels, %2zu parses     %9.3f %9.3f\n", level, m.state().n, ms.front(),
                ms[ms.size() / 2]);
  }
  return 0;
}
