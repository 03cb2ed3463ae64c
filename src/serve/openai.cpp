// Request parsing and chat templates of the OpenAI API (openai.h).
#include "serve/openai.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "diffattn/base/json_util.h"

namespace diffattn::serve {

using nlohmann::json;

std::string error_json(const std::string& message, const std::string& type,
                       const std::string& param, const std::string& code) {
  json e = {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

[[noreturn]] void wrong_type(const std::string& field, const char* want, const json& v) {
  throw ApiError("'" + field + "' must be " + want + ", got " + type_name(v) + " (" +
                     json_brief(v) + ")",
                 field, 400, "invalid_request_error", "invalid_type");
}

[[noreturn]] void out_of_range(const std::string& field, const std::string& range, const json& v) {
  throw ApiError("'" + field + "' must be " + range + ", got " + json_brief(v), field, 400,
                 "invalid_request_error", "invalid_value");
}

double number(const json& v, const std::string& field) {
  if (!v.is_number()) wrong_type(field, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d)) out_of_range(field, "a finite number", v);
  return d;
}

int64_t integer(const json& v, const std::string& field) {
  // 2.0 is an integer in JSON's sense (Python clients send floats sometimes); 2.5 is not.
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      out_of_range(field, "at most 2^63 - 1", v);
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  wrong_type(field, "an integer", v);
}

bool boolean(const json& v, const std::string& field) {
  if (!v.is_boolean()) wrong_type(field, "true or false", v);
  return v.get<bool>();
}

const std::string& string(const json& v, const std::string& field) {
  if (!v.is_string()) wrong_type(field, "a string", v);
  return v.get_ref<const std::string&>();
}

std::string content_text(const json& c, const std::string& field) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) wrong_type(field, "a string or an array of text parts", c);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string f = field + "[" + std::to_string(i) + "]";
    const json& part = c[i];
    if (!part.is_object()) wrong_type(f, "an object {\"type\": \"text\", \"text\": ...}", part);
    for (const auto& [k, v] : part.items()) {
      if (k != "type" && k != "text") {
        throw ApiError("unknown field '" + f + "." + k + "'", f + "." + k, 400,
                       "invalid_request_error", "unknown_field");
      }
    }
    if (!part.contains("type") || string(part["type"], f + ".type") != "text") {
      throw ApiError("'" + f + ".type' must be \"text\" (only text content is supported)",
                     f + ".type");
    }
    if (!part.contains("text")) throw ApiError("'" + f + ".text' is missing", f + ".text");
    out += string(part["text"], f + ".text");
  }
  return out;
}

}  // namespace

ApiRequest parse_request(const std::string& body, bool chat, const ApiLimits& lim) {
  json j;
  try {
    j = parse_json_bounded(body, "the request body");
  } catch (const InvalidArgument& e) {
    throw ApiError(e.what(), "", 400, "invalid_request_error", "invalid_json");
  }
  if (!j.is_object()) {
    throw ApiError(std::string("the request body must be a JSON object, got ") + type_name(j));
  }
  static const std::set<std::string> common = {"model", "max_tokens", "temperature", "top_p",
                                               "top_k", "seed", "stop", "n", "stream",
                                               "stream_options", "user"};
  ApiRequest r;
  r.chat = chat;
  for (const auto& [k, v] : j.items()) {
    const bool known = common.count(k) != 0 ||
                       (chat ? (k == "messages" || k == "max_completion_tokens") : k == "prompt");
    if (!known) {
      throw ApiError("unknown field " + quote_name(k, 60) + " (this server takes: " +
                         (chat ? std::string("messages, max_tokens, max_completion_tokens")
                               : std::string("prompt, max_tokens")) +
                         ", temperature, top_p, top_k, seed, stop, n, stream, stream_options, "
                         "model, user)",
                     k, 400, "invalid_request_error", "unknown_field");
    }
    if (v.is_null()) continue;  // null means "not given", as in OpenAI's API
    if (k == "model") {
      r.model = string(v, k);
    } else if (k == "user") {
      string(v, k);
    } else if (k == "max_tokens" || k == "max_completion_tokens") {
      const int64_t m = integer(v, k);
      if (m < 1 || m > lim.max_tokens) out_of_range(k, "in 1.." + std::to_string(lim.max_tokens), v);
      r.max_tokens = m;
    } else if (k == "temperature") {
      r.temperature = number(v, k);
      if (r.temperature < 0 || r.temperature > 2) out_of_range(k, "in [0, 2]", v);
    } else if (k == "top_p") {
      r.top_p = number(v, k);
      if (!(r.top_p > 0 && r.top_p <= 1)) out_of_range(k, "in (0, 1]", v);
    } else if (k == "top_k") {
      r.top_k = integer(v, k);
      if (r.top_k == -1) r.top_k = 0;  // vLLM's spelling of "no limit"
      if (r.top_k < 0 || r.top_k > (int64_t{1} << 30)) out_of_range(k, ">= 0 (0 or -1: no limit)", v);
    } else if (k == "seed") {
      r.seed = integer(v, k);
    } else if (k == "n") {
      r.n = integer(v, k);
      if (r.n < 1 || r.n > lim.max_n) out_of_range(k, "in 1.." + std::to_string(lim.max_n), v);
    } else if (k == "stream") {
      r.stream = boolean(v, k);
    } else if (k == "stream_options") {
      if (!v.is_object()) wrong_type(k, "an object", v);
      for (const auto& [sk, sv] : v.items()) {
        if (sk != "include_usage") {
          throw ApiError("unknown field 'stream_options." + sk + "'", "stream_options." + sk,
                         400, "invalid_request_error", "unknown_field");
        }
        if (!sv.is_null()) r.include_usage = boolean(sv, "stream_options.include_usage");
      }
    } else if (k == "stop") {
      if (v.is_string()) {
        r.stop.push_back(v.get<std::string>());
      } else if (v.is_array()) {
        for (size_t i = 0; i < v.size(); ++i) r.stop.push_back(string(v[i], "stop[" + std::to_string(i) + "]"));
      } else {
        wrong_type(k, "a string or an array of strings", v);
      }
      if (r.stop.size() > lim.max_stop) {
        out_of_range(k, "at most " + std::to_string(lim.max_stop) + " strings", v);
      }
      for (const std::string& s : r.stop) {
        if (s.empty() || s.size() > lim.max_stop_bytes) {
          out_of_range(k, "strings of 1.." + std::to_string(lim.max_stop_bytes) + " bytes", v);
        }
      }
    } else if (k == "prompt") {
      if (v.is_string()) {
        r.prompt = v.get<std::string>();
        if (r.prompt.size() > lim.max_prompt_bytes) {
          throw ApiError("'prompt' is longer than " + std::to_string(lim.max_prompt_bytes) + " bytes",
                         k, 400, "invalid_request_error", "prompt_too_long");
        }
      } else if (v.is_array() && !v.empty() && v[0].is_string()) {
        if (v.size() != 1) {
          throw ApiError("'prompt' as a list of strings must hold exactly one (send one request "
                         "per prompt)", k, 400, "invalid_request_error", "invalid_value");
        }
        r.prompt = v[0].get<std::string>();
        if (r.prompt.size() > lim.max_prompt_bytes) {
          throw ApiError("'prompt' is longer than " + std::to_string(lim.max_prompt_bytes) + " bytes",
                         k, 400, "invalid_request_error", "prompt_too_long");
        }
      } else if (v.is_array()) {
        if (static_cast<int64_t>(v.size()) > lim.max_prompt_ids) {
          throw ApiError("'prompt' has more than " + std::to_string(lim.max_prompt_ids) + " token ids",
                         k, 400, "invalid_request_error", "prompt_too_long");
        }
        r.prompt_is_ids = true;
        for (size_t i = 0; i < v.size(); ++i) {
          const std::string f = "prompt[" + std::to_string(i) + "]";
          if (!v[i].is_number_integer()) wrong_type(f, "a token id (an integer)", v[i]);
          const int64_t id = integer(v[i], f);
          if (id < 0 || id > INT32_MAX) out_of_range(f, "a token id >= 0", v[i]);
          r.prompt_ids.push_back(static_cast<int32_t>(id));
        }
      } else {
        wrong_type(k, "a string or an array of token ids", v);
      }
    } else if (k == "messages") {
      if (!v.is_array()) wrong_type(k, "an array of messages", v);
      if (v.empty()) throw ApiError("'messages' must not be empty", k);
      if (v.size() > lim.max_messages) {
        out_of_range(k, "at most " + std::to_string(lim.max_messages) + " messages", v);
      }
      size_t bytes = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string f = "messages[" + std::to_string(i) + "]";
        const json& m = v[i];
        if (!m.is_object()) wrong_type(f, "an object {\"role\", \"content\"}", m);
        ChatMessage cm;
        for (const auto& [mk, mv] : m.items()) {
          if (mk == "role") {
            cm.role = string(mv, f + ".role");
          } else if (mk == "content") {
            cm.content = content_text(mv, f + ".content");
          } else if (mk != "name") {
            throw ApiError("unknown field '" + f + "." + mk + "'", f + "." + mk, 400,
                           "invalid_request_error", "unknown_field");
          }
        }
        if (!m.contains("role")) throw ApiError("'" + f + ".role' is missing", f + ".role");
        if (!m.contains("content")) throw ApiError("'" + f + ".content' is missing", f + ".content");
        if (cm.role != "system" && cm.role != "user" && cm.role != "assistant") {
          throw ApiError("'" + f + ".role' must be \"system\", \"user\" or \"assistant\", got " +
                             quote_name(cm.role, 40),
                         f + ".role", 400, "invalid_request_error", "invalid_value");
        }
        bytes += cm.content.size();
        if (bytes > lim.max_prompt_bytes) {
          throw ApiError("the messages' contents are longer than " +
                             std::to_string(lim.max_prompt_bytes) + " bytes together",
                         k, 400, "invalid_request_error", "prompt_too_long");
        }
        r.messages.push_back(std::move(cm));
      }
    }
  }
  if (chat && r.messages.empty()) throw ApiError("'messages' is required", "messages");
  if (!chat && !j.contains("prompt")) throw ApiError("'prompt' is required", "prompt");
  if (!chat && r.prompt_is_ids && r.prompt_ids.empty()) {
    throw ApiError("'prompt' has no token ids", "prompt");
  }
  if (r.include_usage && !r.stream) {
    throw ApiError("'stream_options' is only allowed with \"stream\": true", "stream_options");
  }
  return r;
}

// ---- chat templates ----

namespace {

ChatTemplate checked(tokenize::ModelChatTemplates t, const std::string& missing) {
  if (!t.has_template()) {
    throw ApiError("this model has no chat template: " + missing + "; use /v1/completions with a prompt instead",
                   "messages", 400, "invalid_request_error", "no_chat_template");
  }
  return ChatTemplate(std::move(t));
}

}  // namespace

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  try {
    return checked(tokenize::ModelChatTemplates::load(dir),
                   dir + " has no chat_template.jinja and no tokenizer_config.json with a \"chat_template\"");
  } catch (const tokenize::TemplateError& e) {
    if (e.kind() != tokenize::TemplateError::Kind::kIo) throw;  // does not parse: the server does not start
    throw ApiError(std::string("the model's chat template cannot be read: ") + e.what(), "messages", 400,
                   "invalid_request_error", "no_chat_template");
  }
}

ChatTemplate ChatTemplate::from_config(const std::string& text, const std::string& where) {
  try {
    return checked(tokenize::ModelChatTemplates::from_config_text(text, where), where + " has no \"chat_template\"");
  } catch (const tokenize::TemplateError& e) {
    if (e.kind() != tokenize::TemplateError::Kind::kIo) throw;
    throw ApiError(std::string("the model's chat template cannot be read: ") + e.what(), "messages", 400,
                   "invalid_request_error", "no_chat_template");
  }
}

ChatTemplate::ChatTemplate(tokenize::ModelChatTemplates t)
    : t_(std::make_shared<const tokenize::ModelChatTemplates>(std::move(t))) {}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  tokenize::RenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  try {
    return t_->render(msgs, o);
  } catch (const tokenize::TemplateError& e) {
    const std::string at = " (" + e.template_name() + (e.line() > 0 ? ", line " + std::to_string(e.line()) : "") + ")";
    throw ApiError(e.kind() == tokenize::TemplateError::Kind::kRaised
                       ? "the model's chat template refuses this conversation: " + e.message() + at
                       : "the model's chat template failed on this conversation: " + e.message() + at,
                   "messages", 400, "invalid_request_error", "chat_template_error");
  }
}

}  // namespace diffattn::serve
