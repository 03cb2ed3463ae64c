// The OpenAI HTTP API of `diffattn serve` without sockets: request parsing and validation (a pure
// function of the body, fuzzed by fuzz/fuzz_openai_request.cpp), chat templates, error objects.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "diffattn/base/error.h"

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
  size_t max_prompt_bytes = 256 * 1024;  // a prompt, or all messages' contents together
  int64_t max_prompt_ids = 65536;        // a prompt given as token ids
  int64_t max_tokens = 4096;             // the largest max_tokens accepted
  int64_t max_n = 16;
  size_t max_stop = 4;                   // stop strings
  size_t max_stop_bytes = 256;           // each
  size_t max_messages = 1024;
};

struct ChatMessage {
  std::string role, content;
};

struct ApiRequest {
  bool chat = false;
  std::string model;                 // empty: not given
  std::string prompt;                // completions: the text ...
  std::vector<int32_t> prompt_ids;   // ... or token ids (then prompt_is_ids)
  bool prompt_is_ids = false;
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // absent: the endpoint's default
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  int64_t n = 1;
  bool stream = false, include_usage = false;
};

// Parses and checks a POST body of /v1/completions (chat false) or /v1/chat/completions.
// Malformed JSON, a non-object, an unknown field, a wrong type or an out-of-range value throws
// ApiError naming the field (param).
ApiRequest parse_request(const std::string& body, bool chat, const ApiLimits& limits);

// A chat template the server can render. Only the Llama-3 template is recognised (the text of
// Meta-Llama-3-*-Instruct's tokenizer_config.json); it is rendered exactly as Jinja would:
//   bos + for each message: "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content)
//   "<|eot_id|>", then "<|start_header_id|>assistant<|end_header_id|>\n\n" when a generation
//   prompt is asked for.
class ChatTemplate {
 public:
  // From a tokenizer_config.json's text: its chat_template (a string, or a list of named
  // templates of which "default" is used) and bos_token. Throws ApiError (status 400, naming
  // what is missing) when there is no template or it is not one this server renders; the
  // message names `where`.
  static ChatTemplate from_config(const std::string& text, const std::string& where);
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  const std::string& bos() const { return bos_; }

 private:
  std::string bos_;
};

// Jinja's trim: leading and trailing whitespace removed.
std::string trim(const std::string& s);

}  // namespace diffattn::serve
