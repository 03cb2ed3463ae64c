// The OpenAI HTTP API of `diffattn serve` without sockets: request parsing and validation (a pure
// function of the body, fuzzed by fuzz/fuzz_openai_request.cpp), chat templates, error objects.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diffattn/base/error.h"
#include "diffattn/grammar/json_schema.h"
#include "diffattn/model/model_dir.h"
#include "diffattn/tokenize/chat_template.h"

namespace diffattn::serve {

// A request the API refuses: status (400 unless said), and the OpenAI error object's fields.
class ApiError : public InvalidArgument {
 public:
  ApiError(const std::string& message, std::string param = "", int status = 400,
           std::string type = "invalid_request_error", std::string code = "")
      : InvalidArgument(message), status(status), param(std::move(param)),
        type(std::move(type)), code(std::move(code)) {}
  int status;
  std::string param, type, code;
};

// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
std::string error_json(const std::string& message, const std::string& type = "invalid_request_error",
                       const std::string& param = "", const std::string& code = "");

struct ApiLimits {
  size_t max_prompt_bytes = 256 * 1024;  // a prompt, or all messages' contents and tools together
  int64_t max_prompt_ids = 65536;        // a prompt given as token ids
  int64_t max_tokens = 4096;             // the largest max_tokens accepted
  int64_t max_n = 16;
  size_t max_stop = 4;                   // stop strings
  size_t max_stop_bytes = 256;           // each
  size_t max_messages = 1024;
  size_t max_tools = 128;                // tools, and tool calls in one message
  int64_t max_logprobs = 20;             // top_logprobs (chat), logprobs (completions)
  size_t max_logit_bias = 1024;          // entries of logit_bias
  size_t max_schema_bytes = 64 * 1024;   // response_format's json_schema.schema, as JSON text
};

// One chat message. Roles: system, developer (OpenAI's newer name of system: the template sees
// "system", as templates written before it know no other), user, assistant, tool. `message` is
// what the chat template sees, in this order: role, content (text; "" for a tool-calling
// assistant message without content), name, tool_calls (each call's function.arguments as a JSON object when the string given is
// one, as transformers' tool-use templates expect and vLLM converts), tool_call_id.
// A ChatMessage built in code as {role, content} (message null) renders as those two.
struct ChatMessage {
  std::string role, content;
  nlohmann::ordered_json message;
};

struct ApiRequest {
  bool chat = false;
  std::string model;                 // empty: not given
  std::string prompt;                // completions: the text ...
  std::vector<int32_t> prompt_ids;   // ... or token ids (then prompt_is_ids)
  bool prompt_is_ids = false;
  std::vector<ChatMessage> messages;  // chat
  // chat: the function tools ([{"type": "function", "function": {"name", "description",
  // "parameters"}}], in the order and key order given) the template renders (with the model's
  // tool_use template where it has one); null: none. The model's answer is returned as text:
  // tool calls are not parsed out of it ("tool_choice" is accepted and ignored).
  nlohmann::ordered_json tools = nullptr;
  // absent: the endpoint's default. Completions take 0 (with echo: the prompt and, with logprobs,
  // its log probabilities, nothing generated), chat at least 1.
  std::optional<int64_t> max_tokens;
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  int64_t n = 1;
  bool stream = false, include_usage = false;
  double presence_penalty = 0, frequency_penalty = 0;  // in [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;   // increasing ids, biases in [-100, 100]
  // Log probabilities of the tokens: chat "logprobs": true (top_logprobs: top ones per token),
  // completions "logprobs": N (top_logprobs = N).
  bool logprobs = false;
  int64_t top_logprobs = 0;
  bool echo = false;  // completions: the prompt before the completion
  // response_format: "text", "json_object" or "json_schema" (then `grammar`, compiled).
  std::string response_format = "text";
  std::optional<grammar::Grammar> grammar;
  // Fields this server takes and does not use, or does not know (as vLLM and llama.cpp, it
  // ignores them; the server logs each name once): "tool_choice", "user", ...
  std::vector<std::string> ignored;
};

// Parses and checks a POST body of /v1/completions (chat false) or /v1/chat/completions.
// Malformed JSON, a non-object, a wrong type or an out-of-range value throws ApiError naming
// the field (param); so does a response_format schema with a keyword the grammar engine does
// not implement (param "response_format.json_schema.schema", the message naming the keyword
// and its JSON pointer). Unknown fields are ignored and listed in `ignored`.
ApiRequest parse_request(const std::string& body, bool chat, const ApiLimits& limits);

// POST /tokenize {"prompt": "..."} (or chat {"messages": [...]}, rendered with the template and
// add_generation_prompt, "add_generation_prompt" to change it) and POST /detokenize
// {"tokens": [ids]}: vLLM's shapes. Unknown fields are ignored (listed in `ignored`).
struct TokenizeRequest {
  std::string model;
  std::string prompt;
  std::vector<ChatMessage> messages;  // non-empty: a chat
  nlohmann::ordered_json tools = nullptr;  // as ApiRequest::tools
  bool add_generation_prompt = true;
  bool add_special_tokens = true;
  std::vector<std::string> ignored;
};
TokenizeRequest parse_tokenize(const std::string& body, const ApiLimits& limits);
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
  std::vector<std::string> ignored;
};
DetokenizeRequest parse_detokenize(const std::string& body, const ApiLimits& limits);

// --api-key: whether an Authorization header value is "Bearer KEY" (the scheme's case ignored,
// the key compared in time that does not depend on where it differs).
bool bearer_matches(const std::string& header, const std::string& key);

// The model's own chat template (tokenizer_config.json's "chat_template" or chat_template.jinja,
// see include/diffattn/tokenize/chat_template.h), parsed once and rendered per request by the
// project's Jinja engine, with the model's bos_token and eos_token.
class ChatTemplate {
 public:
  // Throws ApiError (status 400, code no_chat_template, naming `dir`) when the model has no
  // template; a template that does not parse is a tokenize::TemplateError naming its file and
  // line (for the server, a start-up error).
  static ChatTemplate from_model_dir(const model::ModelDir& dir);
  // The same from a tokenizer_config.json's text; `where` names it.
  static ChatTemplate from_config(const std::string& text, const std::string& where);
  // Renders a conversation; a template that refuses it (raise_exception) or fails on it throws
  // ApiError (400, param "messages", code chat_template_error) with the template's message.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools = nullptr) const;

  explicit ChatTemplate(tokenize::ModelChatTemplates t);

 private:
  std::shared_ptr<const tokenize::ModelChatTemplates> t_;
};

}  // namespace diffattn::serve
