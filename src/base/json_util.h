// JSON helpers shared by the files that read diffattn's JSON (config.json, training options,
// safetensors headers, the CLI's --config, the explorer's requests): one place that turns bad
// text into an error naming its source, with two guards for text diffattn did not write.
//  - Depth: a value nested deeper than kMaxJsonDepth is an error at parse time. nlohmann's
//    parser is iterative, but dump() and every recursive walk are not, so an array nested
//    300000 deep would overflow the stack later (in an error message, of all places).
//  - Echo: json_brief() quotes a user's value in a message, cut to a few dozen characters.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "diffattn/base/error.h"

namespace diffattn {

// Deeper than any file diffattn reads needs (a config is 2 levels, a safetensors header 3).
inline constexpr int kMaxJsonDepth = 64;

// Parses [first, last) as JSON, rejecting nesting deeper than kMaxJsonDepth. `where` starts every
// error; errors are InvalidArgument (make_error lets a caller choose IoError for files).
template <class It>
nlohmann::json parse_json_bounded(It first, It last, const std::string& where) {
  struct TooDeep {};  // thrown by the callback: stops the parse at once
  const nlohmann::json::parser_callback_t guard = [](int depth, nlohmann::json::parse_event_t,
                                                     nlohmann::json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(first, last, guard);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(where + ": not valid JSON (" + e.what() + ")");
  } catch (const TooDeep&) {
    throw InvalidArgument(where + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                          " levels");
  }
}

inline nlohmann::json parse_json_bounded(const std::string& text, const std::string& where) {
  return parse_json_bounded(text.begin(), text.end(), where);
}

// Parses text that must hold a JSON object; `where` (a file, a key) starts every error.
inline nlohmann::json parse_json_object(const std::string& text, const std::string& where) {
  nlohmann::json j = parse_json_bounded(text, where);
  if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object");
  return j;
}

// A user's value for an error message: its JSON text (a list only if flat, else "a list of N
// values"; an object as "an object of N keys"), cut to about 40 characters ("..." marks the
// cut); invalid UTF-8 in strings is replaced, never thrown on.
inline std::string json_brief(const nlohmann::json& v) {
  bool flat = !v.is_object();
  if (v.is_array()) {
    for (const auto& e : v) flat = flat && e.is_primitive();
  }
  std::string s;
  if (flat) {
    s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else if (v.is_array()) {
    s = "a list of " + std::to_string(v.size()) + " values";
  } else {
    s = "an object of " + std::to_string(v.size()) + " keys";
  }
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// A name from outside input (a tensor name, a metadata key) for a message: in double quotes,
// JSON-escaped (control characters and invalid UTF-8 made visible), cut to max_chars.
inline std::string quote_name(const std::string& name, size_t max_chars = 200) {
  std::string s = nlohmann::json(name.size() > max_chars ? name.substr(0, max_chars) : name)
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (name.size() > max_chars) s.insert(s.size() - 1, "...");
  return s;
}

}  // namespace diffattn
