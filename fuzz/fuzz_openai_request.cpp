// Fuzzes the OpenAI request layer of `diffattn serve` (src/serve/openai.cpp) without sockets:
// parse_request on a body as /v1/completions and as /v1/chat/completions (with its penalties,
// logit_bias, logprobs, echo, tools, tool calls and response_format schemas compiled by the grammar engine), then a
// chat template (Llama 3's, through the engine of src/tokenize) over what it accepted, the bodies
// of POST /tokenize and POST /detokenize, the --api-key check of an Authorization header, and
// ChatTemplate::from_config on the same bytes as a tokenizer_config.json. Every input either
// parses or throws a diffattn::Error (ApiError for the requests, with a 4xx status and an error
// object that is valid JSON).
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
      if (r.max_tokens && (*r.max_tokens < (chat ? 1 : 0) || *r.max_tokens > lim.max_tokens)) std::abort();
      if (!r.tools.is_null() && (!chat || !r.tools.is_array() || r.tools.size() > lim.max_tools)) std::abort();
      for (const ChatMessage& m : r.messages) {
        if (m.message.at("role") == "developer" || !m.message.is_object()) std::abort();
      }
      if (r.top_logprobs < 0 || r.top_logprobs > lim.max_logprobs) std::abort();
      if (!(r.presence_penalty >= -2 && r.presence_penalty <= 2)) std::abort();
      if (!(r.frequency_penalty >= -2 && r.frequency_penalty <= 2)) std::abort();
      for (size_t i = 0; i < r.logit_bias.size(); ++i) {
        const auto& [id, b] = r.logit_bias[i];
        if (id < 0 || !(b >= -100 && b <= 100) || (i > 0 && id <= r.logit_bias[i - 1].first)) std::abort();
      }
      if (r.grammar.has_value() != (r.response_format != "text")) std::abort();
      if (r.grammar) {
        diffattn::grammar::Matcher m(*r.grammar);
        (void)m.allowed_bytes();
      }
      if (chat) (void)tmpl.render(r.messages, true, r.tools);
    } catch (const ApiError& e) {
      if (e.status < 400 || e.status > 499) std::abort();
      (void)nlohmann::json::parse(error_json(e.what(), e.type, e.param, e.code));
    } catch (const diffattn::Error&) {
    }
  }
  for (const bool tokenize : {true, false}) {
    try {
      if (tokenize) {
        const TokenizeRequest t = parse_tokenize(body, lim);
        if (t.prompt.size() > lim.max_prompt_bytes) std::abort();
        if (!t.messages.empty()) (void)tmpl.render(t.messages, t.add_generation_prompt);
      } else {
        const DetokenizeRequest d = parse_detokenize(body, lim);
        for (const int32_t id : d.tokens) {
          if (id < 0) std::abort();
        }
      }
    } catch (const ApiError& e) {
      if (e.status < 400 || e.status > 499) std::abort();
      (void)nlohmann::json::parse(error_json(e.what(), e.type, e.param, e.code));
    } catch (const diffattn::Error&) {
    }
  }
  // The API key check: only "Bearer" (any case), blanks, and the key itself pass.
  if (bearer_matches(body, "k3y") && body.find("k3y") == std::string::npos) std::abort();
  if (bearer_matches(body, "")) std::abort();
  try {
    (void)ChatTemplate::from_config(body, "fuzz/tokenizer_config.json");
  } catch (const diffattn::Error&) {
  }
  return 0;
}
