// Fuzzes the OpenAI request layer of `diffattn serve` (src/serve/openai.cpp) without sockets:
// parse_request on a body as /v1/completions and as /v1/chat/completions, then a chat template
// (Llama 3's, through the engine of src/tokenize) over what it accepted, and
// ChatTemplate::from_config on the same bytes as a tokenizer_config.json. Every input either parses or throws a diffattn::Error (ApiError for the
// requests, with a 4xx status and an error object that is valid JSON).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/openai.h"

namespace {

const char* const kTemplate =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace diffattn::serve;
  const std::string body(reinterpret_cast<const char*>(data), size);
  ApiLimits lim;
  lim.max_prompt_bytes = 4096;
  static const ChatTemplate tmpl = ChatTemplate::from_config(
      nlohmann::json{{"bos_token", "<|begin_of_text|>"}, {"chat_template", kTemplate}}.dump(), "t");
  for (const bool chat : {false, true}) {
    try {
      const ApiRequest r = parse_request(body, chat, lim);
      if (r.n < 1 || r.n > lim.max_n) std::abort();
      if (r.max_tokens && (*r.max_tokens < 1 || *r.max_tokens > lim.max_tokens)) std::abort();
      if (chat) (void)tmpl.render(r.messages, true);
    } catch (const ApiError& e) {
      if (e.status < 400 || e.status > 499) std::abort();
      (void)nlohmann::json::parse(error_json(e.what(), e.type, e.param, e.code));
    } catch (const diffattn::Error&) {
    }
  }
  try {
    (void)ChatTemplate::from_config(body, "fuzz/tokenizer_config.json");
  } catch (const diffattn::Error&) {
  }
  return 0;
}
