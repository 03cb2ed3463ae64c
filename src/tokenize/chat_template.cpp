// Chat templates (include/diffattn/tokenize/chat_template.h): parsing once, rendering with
// transformers' variables, and a model directory's templates and special tokens.
#include "diffattn/tokenize/chat_template.h"

#include <sys/stat.h>

#include <new>
#include <stdexcept>

#include "diffattn/base/json_util.h"
#include "diffattn/base/files.h"
#include "tokenize/interp.h"

namespace diffattn::tokenize {

namespace {

std::string where_text(const std::string& name, int line, int column) {
  if (line <= 0) return name;
  return name + ", line " + std::to_string(line) + ", column " + std::to_string(column);
}

[[noreturn]] void rethrow(const jinja::RenderError& e, const std::string& name) {
  throw TemplateError(e.kind, e.message, name, e.line, e.col);
}

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

TemplateError::TemplateError(Kind kind, std::string message, std::string template_name, int line, int column)
    : InvalidArgument(where_text(template_name, line, column) + ": " + message),
      kind_(kind),
      message_(std::move(message)),
      name_(std::move(template_name)),
      line_(line),
      column_(column) {}

ChatTemplate ChatTemplate::parse(std::string_view source, std::string name, const ChatTemplateLimits& limits) {
  ChatTemplate t;
  try {
    t.program_ = jinja::parse_program(source, name, limits);
  } catch (const jinja::RenderError& e) {
    rethrow(e, name);
  } catch (const std::bad_alloc&) {
    throw TemplateError(TemplateError::Kind::kLimit, "out of memory while parsing", name, 0, 0);
  }
  return t;
}

const std::string& ChatTemplate::name() const { return program_->name; }

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const RenderOptions& options) const {
  const jinja::Program& p = *program_;
  try {
    std::vector<std::pair<std::string, jinja::Value>> vars;
    if (!options.extra.is_null() && !options.extra.is_object()) {
      throw jinja::RenderError{TemplateError::Kind::kType, "the extra variables must be a JSON object"};
    }
    static const char* const kFixed[] = {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"};
    if (options.extra.is_object()) {
      for (const auto& [k, v] : options.extra.items()) {
        for (const char* f : kFixed) {
          if (k == f) {
            throw jinja::RenderError{TemplateError::Kind::kType, "the extra variable \"" + k + "\" is set by its own option"};
          }
        }
        vars.emplace_back(k, jinja::from_json(v));
      }
    }
    vars.emplace_back("messages", jinja::from_json(messages));
    vars.emplace_back("tools", jinja::from_json(options.tools));
    vars.emplace_back("documents", jinja::from_json(options.documents));
    vars.emplace_back("add_generation_prompt", jinja::Value(options.add_generation_prompt));
    if (options.bos_token) vars.emplace_back("bos_token", jinja::from_json(*options.bos_token));
    if (options.eos_token) vars.emplace_back("eos_token", jinja::from_json(*options.eos_token));
    jinja::Interp in(p, options);
    return in.render(std::move(vars));
  } catch (const jinja::RenderError& e) {
    rethrow(e, p.name);
  } catch (const std::bad_alloc&) {
    throw TemplateError(TemplateError::Kind::kLimit, "out of memory while rendering", p.name, 0, 0);
  } catch (const std::length_error&) {
    throw TemplateError(TemplateError::Kind::kLimit, "a value too large while rendering", p.name, 0, 0);
  }
}

// ---- a model directory ----

namespace {

std::optional<std::string> token_text(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return std::nullopt;
  const nlohmann::json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

[[noreturn]] void bad_config(const std::string& where, const std::string& msg) {
  throw TemplateError(TemplateError::Kind::kIo, msg, where, 0, 0);
}

}  // namespace

ModelChatTemplates ModelChatTemplates::from_config_text(const std::string& text, const std::string& where,
                                                        const ChatTemplateLimits& limits) {
  nlohmann::json j;
  try {
    j = parse_json_object(text, where);
  } catch (const InvalidArgument& e) {
    bad_config(where, e.what());
  }
  ModelChatTemplates m;
  m.where_ = where;
  m.bos_ = token_text(j, "bos_token");
  m.eos_ = token_text(j, "eos_token");
  if (!j.contains("chat_template") || j["chat_template"].is_null()) return m;
  const nlohmann::json& t = j["chat_template"];
  if (t.is_string()) {
    m.default_ = std::make_shared<ChatTemplate>(ChatTemplate::parse(t.get<std::string>(), where, limits));
    return m;
  }
  if (!t.is_array()) bad_config(where, "\"chat_template\" must be a string or a list of {\"name\", \"template\"}");
  for (size_t i = 0; i < t.size(); ++i) {
    const nlohmann::json& e = t[i];
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
        !e["template"].is_string()) {
      bad_config(where, "\"chat_template\"[" + std::to_string(i) + "] must be {\"name\": a string, \"template\": a string}");
    }
    const std::string name = e["name"].get<std::string>();
    if (name != "default" && name != "tool_use") continue;  // others are picked by name, which serve does not do
    auto parsed = std::make_shared<ChatTemplate>(
        ChatTemplate::parse(e["template"].get<std::string>(), where + " (chat_template \"" + name + "\")", limits));
    (name == "default" ? m.default_ : m.tool_use_) = std::move(parsed);
  }
  return m;
}

ModelChatTemplates ModelChatTemplates::load(const std::string& model_dir, const ChatTemplateLimits& limits) {
  const std::string cfg = model_dir + "/tokenizer_config.json";
  std::optional<std::string> text;
  if (is_file(cfg)) text = read_file(cfg, kMaxJsonFileBytes);
  return load(model_dir, text, limits);
}

ModelChatTemplates ModelChatTemplates::load(const std::string& model_dir,
                                            const std::optional<std::string>& tokenizer_config,
                                            const ChatTemplateLimits& limits) {
  const std::string cfg = model_dir + "/tokenizer_config.json";
  const std::string jinja_file = model_dir + "/chat_template.jinja";
  const std::string tool_file = model_dir + "/additional_chat_templates/tool_use.jinja";
  ModelChatTemplates m;
  if (tokenizer_config) m = from_config_text(*tokenizer_config, cfg, limits);
  // transformers: template files, when there are any, replace the config's chat_template.
  if (is_file(jinja_file) || is_file(tool_file)) {
    m.default_.reset();
    m.tool_use_.reset();
    std::string where;
    if (is_file(jinja_file)) {
      m.default_ = std::make_shared<ChatTemplate>(
          ChatTemplate::parse(read_file(jinja_file, limits.max_source_bytes + 1), jinja_file, limits));
      where = jinja_file;
    }
    if (is_file(tool_file)) {
      m.tool_use_ = std::make_shared<ChatTemplate>(
          ChatTemplate::parse(read_file(tool_file, limits.max_source_bytes + 1), tool_file, limits));
      where += (where.empty() ? "" : ", ") + tool_file;
    }
    m.where_ = where;
  } else if (!tokenizer_config) {
    m.where_ = model_dir;
  }
  return m;
}

const ChatTemplate* ModelChatTemplates::select(bool with_tools) const {
  if (with_tools && tool_use_) return tool_use_.get();
  return default_.get();
}

std::string ModelChatTemplates::render(const nlohmann::ordered_json& messages, RenderOptions options) const {
  const ChatTemplate* t = select(!options.tools.is_null());
  if (t == nullptr) {
    throw InvalidArgument(has_template() ? where_ + ": this model has chat templates but no \"default\" one"
                                         : where_ + ": this model has no chat template");
  }
  if (!options.bos_token) options.bos_token = bos_;
  if (!options.eos_token) options.eos_token = eos_;
  return t->render(messages, options);
}

}  // namespace diffattn::tokenize
