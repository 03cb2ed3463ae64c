// Request parsing and chat templates of the OpenAI API (openai.h).
#include "serve/openai.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "diffattn/base/json_util.h"

namespace diffattn::serve {

using nlohmann::json;
using nlohmann::ordered_json;

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

namespace {

json parse_body(const std::string& body) {
  json j;
  try {
    j = parse_json_bounded(body, "the request body");
  } catch (const InvalidArgument& e) {
    throw ApiError(e.what(), "", 400, "invalid_request_error", "invalid_json");
  }
  if (!j.is_object()) {
    throw ApiError(std::string("the request body must be a JSON object, got ") + type_name(j));
  }
  return j;
}

// tools: [{"type": "function", "function": {"name", "description", "parameters"}}]; the
// ordered copy (o) is what the template sees. Counts its JSON text into `bytes`.
ordered_json parse_tools(const json& v, const ordered_json& o, const ApiLimits& lim, size_t& bytes) {
  const std::string k = "tools";
  if (!v.is_array()) wrong_type(k, "an array of tools", v);
  if (v.size() > lim.max_tools) out_of_range(k, "at most " + std::to_string(lim.max_tools) + " tools", v);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = k + "[" + std::to_string(i) + "]";
    const json& t = v[i];
    if (!t.is_object()) wrong_type(f, "an object {\"type\": \"function\", \"function\": {...}}", t);
    if (!t.contains("type") || string(t["type"], f + ".type") != "function") {
      throw ApiError("'" + f + ".type' must be \"function\"", f + ".type");
    }
    if (!t.contains("function")) throw ApiError("'" + f + ".function' is missing", f + ".function");
    const json& fn = t["function"];
    if (!fn.is_object()) wrong_type(f + ".function", "an object {\"name\", \"description\", \"parameters\"}", fn);
    if (!fn.contains("name")) throw ApiError("'" + f + ".function.name' is missing", f + ".function.name");
    string(fn["name"], f + ".function.name");
    if (fn.contains("description") && !fn["description"].is_null()) string(fn["description"], f + ".function.description");
    if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object()) {
      wrong_type(f + ".function.parameters", "a JSON schema object", fn["parameters"]);
    }
  }
  bytes += o.dump().size();
  return o;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments"}}]. arguments is a string of JSON in OpenAI's API; where it holds an object, the
// template gets the object (transformers' tool-use templates write `arguments | tojson`).
ordered_json parse_tool_calls(const json& v, const ordered_json& o, const std::string& field,
                              const ApiLimits& lim, size_t& bytes) {
  if (!v.is_array()) wrong_type(field, "an array of tool calls", v);
  if (v.size() > lim.max_tools) out_of_range(field, "at most " + std::to_string(lim.max_tools) + " calls", v);
  ordered_json out = o;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = field + "[" + std::to_string(i) + "]";
    const json& c = v[i];
    if (!c.is_object()) wrong_type(f, "an object {\"id\", \"type\": \"function\", \"function\": {...}}", c);
    if (c.contains("id") && !c["id"].is_null()) string(c["id"], f + ".id");
    if (c.contains("type") && !c["type"].is_null() && string(c["type"], f + ".type") != "function") {
      throw ApiError("'" + f + ".type' must be \"function\"", f + ".type");
    }
    if (!c.contains("function")) throw ApiError("'" + f + ".function' is missing", f + ".function");
    const json& fn = c["function"];
    if (!fn.is_object()) wrong_type(f + ".function", "an object {\"name\", \"arguments\"}", fn);
    if (!fn.contains("name")) throw ApiError("'" + f + ".function.name' is missing", f + ".function.name");
    string(fn["name"], f + ".function.name");
    if (!fn.contains("arguments") || fn["arguments"].is_null()) continue;
    const json& a = fn["arguments"];
    if (a.is_object()) continue;
    const std::string& text = string(a, f + ".function.arguments");
    json parsed;
    try {
      parsed = parse_json_bounded(text, f + ".function.arguments");
    } catch (const InvalidArgument&) {
      continue;  // not JSON: the template gets the string as given
    }
    if (parsed.is_object()) out[i]["function"]["arguments"] = ordered_json::parse(text);
  }
  bytes += out.dump().size();
  return out;
}

// messages; `o` is the same array in its key order when a message has tool_calls (else null).
std::vector<ChatMessage> parse_messages(const json& v, const ordered_json& o, const ApiLimits& lim,
                                        size_t& bytes, std::vector<std::string>& ignored) {
  const std::string k = "messages";
  if (!v.is_array()) wrong_type(k, "an array of messages", v);
  if (v.empty()) throw ApiError("'messages' must not be empty", k);
  if (v.size() > lim.max_messages) {
    out_of_range(k, "at most " + std::to_string(lim.max_messages) + " messages", v);
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) wrong_type(f, "an object {\"role\", \"content\"}", m);
    ChatMessage cm;
    bool content_null = false;
    std::optional<std::string> name, tool_call_id;
    ordered_json tool_calls = nullptr;
    for (const auto& [mk, mv] : m.items()) {
      if (mk == "role") {
        cm.role = string(mv, f + ".role");
      } else if (mk == "content") {
        if (mv.is_null()) {
          content_null = true;
        } else {
          cm.content = content_text(mv, f + ".content");
        }
      } else if (mk == "name") {
        if (!mv.is_null()) name = string(mv, f + ".name");
      } else if (mk == "tool_call_id") {
        if (!mv.is_null()) tool_call_id = string(mv, f + ".tool_call_id");
      } else if (mk == "tool_calls") {
        if (!mv.is_null()) tool_calls = parse_tool_calls(mv, o.at(i).at("tool_calls"), f + ".tool_calls", lim, bytes);
      } else {
        ignored.push_back("messages[]." + mk);
      }
    }
    if (!m.contains("role")) throw ApiError("'" + f + ".role' is missing", f + ".role");
    static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
    if (!roles.count(cm.role)) {
      throw ApiError("'" + f + ".role' must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\", got " +
                         quote_name(cm.role, 40),
                     f + ".role", 400, "invalid_request_error", "invalid_value");
    }
    if (!tool_calls.is_null() && cm.role != "assistant") {
      throw ApiError("'" + f + ".tool_calls' belongs to assistant messages, this one is \"" + cm.role + "\"",
                     f + ".tool_calls");
    }
    // Only an assistant message that calls tools may go without content.
    if ((!m.contains("content") || content_null) && tool_calls.is_null()) {
      throw ApiError("'" + f + ".content' is missing", f + ".content");
    }
    // A tool-calling assistant message without content gets "": templates use the content as a
    // string (Qwen3's tests `'</think>' in message.content`, which fails on None).
    cm.message = {{"role", cm.role == "developer" ? std::string("system") : cm.role}, {"content", cm.content}};
    if (name) cm.message["name"] = *name;
    if (!tool_calls.is_null()) cm.message["tool_calls"] = std::move(tool_calls);
    if (tool_call_id) cm.message["tool_call_id"] = *tool_call_id;
    bytes += cm.content.size();
    if (bytes > lim.max_prompt_bytes) {
      throw ApiError("the messages' contents are longer than " +
                         std::to_string(lim.max_prompt_bytes) + " bytes together",
                     k, 400, "invalid_request_error", "prompt_too_long");
    }
    out.push_back(std::move(cm));
  }
  return out;
}

// The body in its key order, where a template will see objects the client wrote (tools, tool
// calls); null otherwise. The body already passed parse_body's checks.
ordered_json ordered_if_needed(const std::string& body, const json& j) {
  bool need = j.contains("tools") && !j["tools"].is_null();
  if (j.contains("messages") && j["messages"].is_array()) {
    for (const json& m : j["messages"]) need = need || (m.is_object() && m.contains("tool_calls"));
  }
  return need ? ordered_json::parse(body) : ordered_json();
}

// messages and tools of a chat request or a /tokenize request.
void parse_chat_fields(const json& j, const ordered_json& o, const ApiLimits& lim,
                       std::vector<ChatMessage>& messages, ordered_json& tools,
                       std::vector<std::string>& ignored) {
  size_t bytes = 0;
  if (j.contains("tools") && !j["tools"].is_null()) tools = parse_tools(j["tools"], o.at("tools"), lim, bytes);
  if (j.contains("messages") && !j["messages"].is_null()) {
    messages = parse_messages(j["messages"], o.is_null() ? o : o.at("messages"), lim, bytes, ignored);
  }
  if (bytes > lim.max_prompt_bytes) {
    throw ApiError("the messages' contents and the tools are longer than " +
                       std::to_string(lim.max_prompt_bytes) + " bytes together",
                   "messages", 400, "invalid_request_error", "prompt_too_long");
  }
}

std::string prompt_string(const json& v, const std::string& k, const ApiLimits& lim) {
  std::string p = v.get<std::string>();
  if (p.size() > lim.max_prompt_bytes) {
    throw ApiError("'" + k + "' is longer than " + std::to_string(lim.max_prompt_bytes) + " bytes",
                   k, 400, "invalid_request_error", "prompt_too_long");
  }
  return p;
}

std::vector<int32_t> token_ids(const json& v, const std::string& k, const ApiLimits& lim) {
  if (static_cast<int64_t>(v.size()) > lim.max_prompt_ids) {
    throw ApiError("'" + k + "' has more than " + std::to_string(lim.max_prompt_ids) + " token ids",
                   k, 400, "invalid_request_error", "prompt_too_long");
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = k + "[" + std::to_string(i) + "]";
    if (!v[i].is_number_integer()) wrong_type(f, "a token id (an integer)", v[i]);
    const int64_t id = integer(v[i], f);
    if (id < 0 || id > INT32_MAX) out_of_range(f, "a token id >= 0", v[i]);
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

// response_format: {"type": "text"} | {"type": "json_object"} |
// {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}.
void parse_response_format(const json& v, const ordered_json* ordered, ApiRequest& r,
                           const ApiLimits& lim) {
  const std::string k = "response_format";
  if (!v.is_object()) wrong_type(k, "an object {\"type\": ...}", v);
  if (!v.contains("type")) throw ApiError("'response_format.type' is missing", k + ".type");
  const std::string& type = string(v["type"], k + ".type");
  for (const auto& [fk, fv] : v.items()) {
    if (fk != "type" && fk != "json_schema") r.ignored.push_back(k + "." + fk);
  }
  if (type == "text") return;
  if (type == "json_object") {
    r.response_format = type;
    r.grammar = grammar::Grammar::json_object();
    return;
  }
  if (type != "json_schema") {
    throw ApiError("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got " +
                       quote_name(type, 40),
                   k + ".type", 400, "invalid_request_error", "invalid_value");
  }
  const std::string f = k + ".json_schema";
  if (!v.contains("json_schema") || v["json_schema"].is_null()) {
    throw ApiError("'" + f + "' is required with \"type\": \"json_schema\"", f);
  }
  const json& js = v["json_schema"];
  if (!js.is_object()) wrong_type(f, "an object {\"name\", \"schema\"}", js);
  for (const auto& [sk, sv] : js.items()) {
    if (sk == "name" || sk == "description") {
      if (!sv.is_null()) string(sv, f + "." + sk);
    } else if (sk == "strict") {
      if (!sv.is_null()) boolean(sv, f + ".strict");
    } else if (sk != "schema") {
      r.ignored.push_back(f + "." + sk);
    }
  }
  const std::string sf = f + ".schema";
  if (!js.contains("schema") || js["schema"].is_null()) {
    // OpenAI's default: any JSON object.
    r.response_format = type;
    r.grammar = grammar::Grammar::json_object();
    return;
  }
  if (!js["schema"].is_object() && !js["schema"].is_boolean()) wrong_type(sf, "an object (a JSON schema)", js["schema"]);
  const ordered_json& schema = (*ordered)["response_format"]["json_schema"]["schema"];
  if (schema.dump().size() > lim.max_schema_bytes) {
    throw ApiError("'" + sf + "' is longer than " + std::to_string(lim.max_schema_bytes) + " bytes as JSON",
                   sf, 400, "invalid_request_error", "invalid_value");
  }
  try {
    r.grammar = grammar::Grammar::json_schema(schema);
  } catch (const grammar::UnsupportedSchema& e) {
    throw ApiError("'" + sf + "': the keyword " + quote_name(e.keyword(), 60) + " at " +
                       (e.path().empty() ? std::string("/") : e.path()) +
                       " is not supported by this server's constrained decoding: " + e.what(),
                   sf, 400, "invalid_request_error", "unsupported_schema");
  } catch (const InvalidArgument& e) {
    throw ApiError("'" + sf + "' is not a usable schema: " + std::string(e.what()), sf, 400,
                   "invalid_request_error", "invalid_schema");
  }
  r.response_format = type;
}

}  // namespace

ApiRequest parse_request(const std::string& body, bool chat, const ApiLimits& lim) {
  const json j = parse_body(body);
  ApiRequest r;
  r.chat = chat;
  std::optional<int64_t> max_tokens, max_completion_tokens;
  for (const auto& [k, v] : j.items()) {
    if (v.is_null()) continue;  // null means "not given", as in OpenAI's API
    if (k == "model") {
      r.model = string(v, k);
    } else if (k == "max_tokens" || (chat && k == "max_completion_tokens")) {
      const int64_t m = integer(v, k);
      const int64_t least = chat ? 1 : 0;  // completions: 0 scores the prompt (with echo)
      if (m < least || m > lim.max_tokens) {
        out_of_range(k, "in " + std::to_string(least) + ".." + std::to_string(lim.max_tokens), v);
      }
      (k == "max_tokens" ? max_tokens : max_completion_tokens) = m;
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
          r.ignored.push_back("stream_options." + sk);
        } else if (!sv.is_null()) {
          r.include_usage = boolean(sv, "stream_options.include_usage");
        }
      }
    } else if (k == "presence_penalty" || k == "frequency_penalty") {
      const double p = number(v, k);
      if (p < -2 || p > 2) out_of_range(k, "in [-2, 2]", v);
      (k == "presence_penalty" ? r.presence_penalty : r.frequency_penalty) = p;
    } else if (k == "logit_bias") {
      if (!v.is_object()) wrong_type(k, "an object {\"token id\": bias}", v);
      if (v.size() > lim.max_logit_bias) {
        out_of_range(k, "at most " + std::to_string(lim.max_logit_bias) + " entries", v);
      }
      for (const auto& [bk, bv] : v.items()) {
        const std::string f = k + "." + bk.substr(0, 40);
        // A token id as decimal digits ("50256"), as OpenAI's API takes it.
        if (bk.empty() || bk.size() > 10 || bk.find_first_not_of("0123456789") != std::string::npos ||
            std::stoll(bk) > INT32_MAX) {
          throw ApiError("'logit_bias' keys must be token ids as decimal strings (\"50256\"), got " +
                             quote_name(bk, 40),
                         k, 400, "invalid_request_error", "invalid_value");
        }
        const double b = number(bv, f);
        if (b < -100 || b > 100) out_of_range(f, "in [-100, 100]", bv);
        r.logit_bias.emplace_back(static_cast<int32_t>(std::stoll(bk)), static_cast<float>(b));
      }
      std::sort(r.logit_bias.begin(), r.logit_bias.end());
      for (size_t i = 1; i < r.logit_bias.size(); ++i) {
        if (r.logit_bias[i].first == r.logit_bias[i - 1].first) {
          throw ApiError("'logit_bias' names token " + std::to_string(r.logit_bias[i].first) +
                             " twice (as \"007\" and \"7\", say)",
                         k, 400, "invalid_request_error", "invalid_value");
        }
      }
    } else if (k == "logprobs") {
      if (chat) {
        r.logprobs = boolean(v, k);
      } else {
        // Completions: the number of most likely tokens to list beside each one (0: none).
        if (v.is_boolean()) wrong_type(k, "an integer (the top log probabilities per token)", v);
        const int64_t n = integer(v, k);
        if (n < 0 || n > lim.max_logprobs) out_of_range(k, "in 0.." + std::to_string(lim.max_logprobs), v);
        r.logprobs = true;
        r.top_logprobs = n;
      }
    } else if (chat && k == "top_logprobs") {
      const int64_t n = integer(v, k);
      if (n < 0 || n > lim.max_logprobs) out_of_range(k, "in 0.." + std::to_string(lim.max_logprobs), v);
      r.top_logprobs = n;
    } else if (!chat && k == "echo") {
      r.echo = boolean(v, k);
    } else if (k == "response_format") {
      const ordered_json o = ordered_json::parse(body);  // the schema's properties in their order
      parse_response_format(v, &o, r, lim);
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
    } else if (!chat && k == "prompt") {
      if (v.is_string()) {
        r.prompt = prompt_string(v, k, lim);
      } else if (v.is_array() && !v.empty() && v[0].is_string()) {
        if (v.size() != 1) {
          throw ApiError("'prompt' as a list of strings must hold exactly one (send one request "
                         "per prompt)", k, 400, "invalid_request_error", "invalid_value");
        }
        r.prompt = prompt_string(v[0], k, lim);
      } else if (v.is_array()) {
        r.prompt_is_ids = true;
        r.prompt_ids = token_ids(v, k, lim);
      } else {
        wrong_type(k, "a string or an array of token ids", v);
      }
    } else if (chat && (k == "messages" || k == "tools")) {
      // below, together
    } else {
      // "user", "store", "metadata", "tool_choice", "suffix", "best_of", ... and names this server
      // does not know: ignored, as vLLM and llama.cpp do (the server logs each once).
      r.ignored.push_back(k);
    }
  }
  if (chat) parse_chat_fields(j, ordered_if_needed(body, j), lim, r.messages, r.tools, r.ignored);
  if (chat && r.messages.empty()) throw ApiError("'messages' is required", "messages");
  if (!chat && !j.contains("prompt")) throw ApiError("'prompt' is required", "prompt");
  if (!chat && r.prompt_is_ids && r.prompt_ids.empty()) {
    throw ApiError("'prompt' has no token ids", "prompt");
  }
  if (r.include_usage && !r.stream) {
    throw ApiError("'stream_options' is only allowed with \"stream\": true", "stream_options");
  }
  if (chat && r.top_logprobs > 0 && !r.logprobs) {
    throw ApiError("'top_logprobs' needs \"logprobs\": true", "top_logprobs");
  }
  // max_completion_tokens is the chat API's newer name of max_tokens: it wins when both come.
  r.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  return r;
}

TokenizeRequest parse_tokenize(const std::string& body, const ApiLimits& lim) {
  const json j = parse_body(body);
  TokenizeRequest r;
  for (const auto& [k, v] : j.items()) {
    if (v.is_null()) continue;
    if (k == "model") {
      r.model = string(v, k);
    } else if (k == "prompt") {
      r.prompt = prompt_string(json(string(v, k)), k, lim);
    } else if (k == "messages" || k == "tools") {
      // below, together
    } else if (k == "add_generation_prompt") {
      r.add_generation_prompt = boolean(v, k);
    } else if (k == "add_special_tokens") {
      r.add_special_tokens = boolean(v, k);
    } else {
      r.ignored.push_back(k);
    }
  }
  parse_chat_fields(j, ordered_if_needed(body, j), lim, r.messages, r.tools, r.ignored);
  const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
  if (has_prompt == !r.messages.empty()) {
    throw ApiError("give exactly one of 'prompt' (a string) and 'messages'", "prompt");
  }
  if (!r.tools.is_null() && r.messages.empty()) throw ApiError("'tools' needs 'messages'", "tools");
  return r;
}

DetokenizeRequest parse_detokenize(const std::string& body, const ApiLimits& lim) {
  const json j = parse_body(body);
  DetokenizeRequest r;
  for (const auto& [k, v] : j.items()) {
    if (v.is_null()) continue;
    if (k == "model") {
      r.model = string(v, k);
    } else if (k == "tokens") {
      if (!v.is_array()) wrong_type(k, "an array of token ids", v);
      r.tokens = token_ids(v, k, lim);
    } else {
      r.ignored.push_back(k);
    }
  }
  if (!j.contains("tokens") || j["tokens"].is_null()) throw ApiError("'tokens' is required", "tokens");
  return r;
}

bool bearer_matches(const std::string& header, const std::string& key) {
  static const std::string scheme = "bearer ";
  if (header.size() < scheme.size()) return false;
  for (size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != scheme[i]) return false;
  }
  std::string given = header.substr(scheme.size());
  while (!given.empty() && (given.back() == ' ' || given.back() == '\t')) given.pop_back();
  while (!given.empty() && (given.front() == ' ' || given.front() == '\t')) given.erase(0, 1);
  // Every byte compared whatever the first difference, so the time says nothing of the key.
  unsigned char diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < key.size(); ++i) {
    diff |= static_cast<unsigned char>(key[i] ^ (i < given.size() ? given[i] : 0));
  }
  return diff == 0 && !key.empty();
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

ChatTemplate ChatTemplate::from_model_dir(const model::ModelDir& d) {
  const std::string& dir = d.path;
  try {
    return checked(tokenize::ModelChatTemplates::load(dir, d.tokenizer_config),
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

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& tools) const {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    // A message built in code as {role, content} (no parsed `message`): those two.
    msgs.push_back(m.message.is_null() ? nlohmann::ordered_json{{"role", m.role}, {"content", m.content}} : m.message);
  }
  tokenize::RenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.tools = tools;
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
