// Fuzzes chat templates (src/tokenize): the input is a template's text, optionally followed by
// "\n#---\n" and a JSON conversation. The template is parsed, then rendered with that
// conversation (or a fixed one with tool calls) and tools, with and without a generation
// prompt. Every failure must be a TemplateError with a message and a kind; anything else, a
// crash, a hang or a leak (ASan's leak checker: a namespace holding itself must not leak) is a
// finding. A rendering must be valid UTF-8 and within the output limit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "diffattn/tokenize/chat_template.h"

namespace {

using json = nlohmann::ordered_json;

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

const json& fixed_messages() {
  static const json m = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "H\u00e9llo \ud83c\udf0d\n  x  "},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "{\"t\": 18}"},
    {"role": "assistant", "content": "<think>\nr\n</think>\n\nIt is 18."},
    {"role": "narrator", "content": "..."},
    {"role": "user", "content": ["a", {"type": "text", "text": "parts"}]}
  ])");
  return m;
}

const json& fixed_tools() {
  static const json t = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
    "required": ["city"]}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using diffattn::tokenize::ChatTemplate;
  using diffattn::tokenize::TemplateError;
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string source = input;
  json messages = fixed_messages();
  const size_t sep = input.find("\n#---\n");
  if (sep != std::string::npos) {
    source = input.substr(0, sep);
    messages = json::parse(input.substr(sep + 6), nullptr, /*allow_exceptions=*/false);
    if (messages.is_discarded()) messages = fixed_messages();
  }
  diffattn::tokenize::ChatTemplateLimits lim;
  lim.max_steps = 200'000;  // small bounds keep each run short; the bounds themselves are what is fuzzed
  lim.max_output_bytes = 1 << 16;
  lim.max_work_bytes = 1 << 24;
  lim.max_items = 100'000;
  lim.max_range = 10'000;
  std::optional<ChatTemplate> t;
  try {
    t = ChatTemplate::parse(source, "fuzz.jinja", lim);
  } catch (const TemplateError& e) {
    if (e.message().empty()) std::abort();
    return 0;
  }
  for (const bool tools : {false, true}) {
    diffattn::tokenize::RenderOptions o;
    o.add_generation_prompt = tools;
    if (tools) o.tools = fixed_tools();
    o.bos_token = "<s>";
    if (tools) o.eos_token = "</s>";
    o.now = diffattn::tokenize::DateTime{2024, 7, 26, 12, 0, 0, 0};
    try {
      const std::string out = t->render(messages, o);
      if (out.size() > lim.max_output_bytes || !valid_utf8(out)) std::abort();
    } catch (const TemplateError& e) {
      if (e.message().empty() && e.kind() != TemplateError::Kind::kRaised) std::abort();
    }
  }
  return 0;
}
