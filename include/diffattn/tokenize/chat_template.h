// Chat templates: a model's own Jinja `chat_template` (tokenizer_config.json or
// chat_template.jinja) rendered by an engine of diffattn's own that behaves as Python's jinja2
// does in transformers' environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loop controls, its tojson, raise_exception and strftime_now). A template is outside input:
// parsing and rendering are bounded (ChatTemplateLimits) and every failure is a TemplateError
// naming the template, line and column. docs/serving.md lists what the engine covers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "diffattn/base/error.h"

namespace diffattn::tokenize {

// A template that does not parse, or a rendering that failed. what() is
// `<name>, line L, column C: <message>`; message() is the message alone (for kRaised, exactly
// the text the template passed to raise_exception).
class TemplateError : public InvalidArgument {
 public:
  enum class Kind {
    kSyntax,     // the template does not parse
    kRaised,     // the template called raise_exception(message)
    kUndefined,  // an undefined value was used (jinja2's UndefinedError)
    kType,       // an operation on the wrong types (Python's TypeError)
    kValue,      // a wrong value (Python's ValueError, ZeroDivisionError, ...)
    kSecurity,   // what jinja2's sandbox refuses (list.append, ...)
    kLimit,      // a limit of ChatTemplateLimits
    kIo,         // a model directory's files
  };
  TemplateError(Kind kind, std::string message, std::string template_name, int line, int column);
  Kind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  const std::string& template_name() const { return name_; }
  int line() const { return line_; }      // 1-based; 0 when no position applies
  int column() const { return column_; }  // 1-based, in code points

 private:
  Kind kind_;
  std::string message_, name_;
  int line_, column_;
};

// Bounds on what a template may make the engine do (a template comes from a model directory
// someone published). Exceeding one is a TemplateError of kind kLimit.
struct ChatTemplateLimits {
  size_t max_source_bytes = 1 << 20;    // the template's text
  int max_nesting = 64;                 // blocks and brackets nested in the source
  int max_call_depth = 32;              // macros calling macros (recursion)
  size_t max_output_bytes = 8 << 20;    // the rendering, and any one string a template builds
  uint64_t max_steps = 20'000'000;      // expressions, statements, loop turns and elements
  uint64_t max_work_bytes = 1ull << 30; // bytes of all strings built during one rendering
  int64_t max_range = 100'000;          // elements of range() (jinja2's sandbox limit)
  size_t max_items = 1'000'000;         // elements of one list or dict a template builds
};

// A calendar time for strftime_now (as Python's naive datetime).
struct DateTime {
  int year = 1970, month = 1, day = 1, hour = 0, minute = 0, second = 0, microsecond = 0;
};

// What a rendering passes to the template besides `messages` (transformers' apply_chat_template
// variables). Use nlohmann::ordered_json so that objects keep their key order (|tojson keeps it).
struct RenderOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools = nullptr;      // null: `tools` is None
  nlohmann::ordered_json documents = nullptr;  // null: `documents` is None
  // Absent: the variable is not passed (the template sees it undefined), as transformers does
  // for a tokenizer without that token. Present but empty: passed as "".
  std::optional<std::string> bos_token, eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables by name
  std::optional<DateTime> now;  // strftime_now's time; absent: the local clock
};

namespace jinja {
struct Program;
}

// A parsed template: parse once, render per request (render is const and thread-safe).
class ChatTemplate {
 public:
  // Throws TemplateError (kSyntax, or kLimit for a source over the limits) naming `name`.
  static ChatTemplate parse(std::string_view source, std::string name,
                            const ChatTemplateLimits& limits = {});
  // `messages` is the conversation (normally an array of objects); throws TemplateError.
  std::string render(const nlohmann::ordered_json& messages, const RenderOptions& options = {}) const;
  const std::string& name() const;

 private:
  std::shared_ptr<const jinja::Program> program_;
};

// A model directory's chat templates and special tokens, resolved as transformers does:
// chat_template.jinja (and additional_chat_templates/<name>.jinja) win over tokenizer_config.json's
// "chat_template", which is a string or a list of {"name", "template"}; "tool_use" is used when
// tools are given and "default" otherwise. bos_token / eos_token come from tokenizer_config.json
// (a string or an AddedToken object {"content": ...}; null or absent: not passed).
class ModelChatTemplates {
 public:
  // Throws IoError for a file that cannot be read, TemplateError for a template that does not
  // parse (naming the file) or a tokenizer_config.json that is not valid JSON. A directory
  // without any template loads; has_template() is then false.
  static ModelChatTemplates load(const std::string& model_dir, const ChatTemplateLimits& limits = {});
  // The same with tokenizer_config.json's text already read (nullopt: the directory has none),
  // as a resolved model directory (model/model_dir.h) holds it.
  static ModelChatTemplates load(const std::string& model_dir,
                                 const std::optional<std::string>& tokenizer_config,
                                 const ChatTemplateLimits& limits = {});
  // The same from a tokenizer_config.json's text alone; `where` names it in errors.
  static ModelChatTemplates from_config_text(const std::string& text, const std::string& where,
                                             const ChatTemplateLimits& limits = {});

  bool has_template() const { return default_ != nullptr || tool_use_ != nullptr; }
  // The template for a rendering with (or without) tools; nullptr when there is none.
  const ChatTemplate* select(bool with_tools) const;
  // Renders with the model's bos/eos tokens filled in where `options` leaves them absent.
  // Throws TemplateError; InvalidArgument when the model has no template.
  std::string render(const nlohmann::ordered_json& messages, RenderOptions options = {}) const;
  const std::optional<std::string>& bos_token() const { return bos_; }
  const std::optional<std::string>& eos_token() const { return eos_; }
  const std::string& source() const { return where_; }  // the file(s) the templates came from

 private:
  std::shared_ptr<const ChatTemplate> default_, tool_use_;
  std::optional<std::string> bos_, eos_;
  std::string where_;
};

}  // namespace diffattn::tokenize
