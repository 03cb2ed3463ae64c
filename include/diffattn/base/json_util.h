// JSON helpers shared by the files that read diffattn's JSON (config.json, training options,
// safetensors headers, the CLI's --config, the explorer's requests): one place that turns bad
// text into an error naming its source, with guards for text diffattn did not write.
//  - Depth: a value nested deeper than kMaxJsonDepth is an error at parse time. nlohmann's
//    parser is iterative, but dump() and every recursive walk are not, so an array nested
//    300000 deep would overflow the stack later (in an error message, of all places).
//  - Bytes nlohmann would let through: it stops at a NUL byte as if the text ended there (so
//    `{...}\0anything` parsed as `{...}`) and skips a UTF-8 byte order mark; Python's json and
//    the Rust readers (serde_json: safetensors, tokenizers) refuse both, and so does this.
//  - Duplicate keys: nlohmann keeps the last value; a reader may ask for an error instead where
//    the reference reader refuses them or where two readers could disagree on the value.
//  - Echo: json_brief() quotes a user's value in a message, cut to a few dozen characters;
//    printable() makes any bytes safe to put in a message (invalid UTF-8 shown as \xNN).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "diffattn/base/error.h"

namespace diffattn {

// Deeper than any file diffattn reads needs (a config is 2 levels, a safetensors header 3).
inline constexpr int kMaxJsonDepth = 64;

// Bytes as text for a message: valid UTF-8 is kept, anything else (a stray byte, a control
// character other than tab and newline) is written \xNN, so a message never carries bytes that
// a terminal or Python's str() would choke on.
inline std::string printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [&](unsigned char c) {
    const char* d = "0123456789abcdef";
    out += "\\x";
    out += d[c >> 4];
    out += d[c & 15];
  };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f) hex(c); else out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len != 0 && i + len <= s.size();
    uint32_t cp = len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; ok && k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      ok = (d >> 6) == 0x2;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if (ok) {
      const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
      ok = cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      hex(c);
      ++i;
    }
  }
  return out;
}

// Whether an object may repeat a key: given the key path of the object (the keys leading to it
// from the top; array elements add nothing) and the key, true lets the last value win
// (nlohmann's rule), false makes the repeat an error naming it. An empty rule lets every repeat
// through.
using JsonDuplicateRule =
    std::function<bool(const std::vector<std::string>& path, const std::string& key)>;
// A rule that refuses every repeated key.
inline bool json_no_duplicates(const std::vector<std::string>&, const std::string&) { return false; }

// Parses [first, last) as JSON, rejecting nesting deeper than kMaxJsonDepth, NUL bytes, a byte
// order mark and (by `duplicates`) repeated keys. `where` starts every error; errors are
// InvalidArgument (callers reading files rethrow them as IoError).
template <class It>
nlohmann::json parse_json_bounded(It first, It last, const std::string& where,
                                  const JsonDuplicateRule& duplicates = {}) {
  struct TooDeep {};  // thrown by the callback: stops the parse at once
  struct Repeated {
    std::string key;
  };
  const It nul = std::find(first, last, '\0');
  if (nul != last) {
    throw InvalidArgument(where + ": not valid JSON (a NUL byte at offset " +
                          std::to_string(std::distance(first, nul)) + ")");
  }
  {
    It p = first;
    const char bom[3] = {'\xEF', '\xBB', '\xBF'};
    int n = 0;
    while (n < 3 && p != last && *p == bom[n]) ++p, ++n;
    if (n == 3) throw InvalidArgument(where + ": not valid JSON (it starts with a UTF-8 byte order mark)");
  }
  // The objects open at this point of the parse: their keys so far and the key path to them.
  struct Frame {
    bool object = false;
    // seen (only when duplicates are checked); a hash set: a tokenizer.json vocabulary is one
    // object of 128k+ keys, which a list made a 25-second quadratic scan
    std::unordered_set<std::string> keys;
    std::string pending;            // the last key: the parent key of a value that opens next
  };
  std::vector<Frame> stack;
  std::vector<std::string> path;
  using event = nlohmann::json::parse_event_t;
  const nlohmann::json::parser_callback_t guard = [&](int depth, event e, nlohmann::json& parsed) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    if (!duplicates) return true;
    if (e == event::object_start || e == event::array_start) {
      if (!stack.empty() && stack.back().object) path.push_back(stack.back().pending);
      stack.push_back({e == event::object_start, {}, {}});
    } else if (e == event::object_end || e == event::array_end) {
      stack.pop_back();
      if (!stack.empty() && stack.back().object) path.pop_back();
    } else if (e == event::key && !stack.empty()) {
      Frame& f = stack.back();
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!f.keys.insert(k).second && !duplicates(path, k)) throw Repeated{k};
      f.pending = k;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(first, last, guard);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(where + ": not valid JSON (" + printable(e.what()) + ")");
  } catch (const TooDeep&) {
    throw InvalidArgument(where + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                          " levels");
  } catch (const Repeated& r) {
    std::string in;
    for (const std::string& k : path) in += (in.empty() ? "" : ".") + printable(k);
    throw InvalidArgument(where + ": the key \"" + printable(r.key) + "\" appears twice in " +
                          (in.empty() ? std::string("the top-level object") : "\"" + in + "\"") +
                          " (readers disagree on which value counts)");
  }
}

inline nlohmann::json parse_json_bounded(const std::string& text, const std::string& where,
                                         const JsonDuplicateRule& duplicates = {}) {
  return parse_json_bounded(text.begin(), text.end(), where, duplicates);
}

// Parses text that must hold a JSON object; `where` (a file, a key) starts every error.
inline nlohmann::json parse_json_object(const std::string& text, const std::string& where,
                                        const JsonDuplicateRule& duplicates = {}) {
  nlohmann::json j = parse_json_bounded(text, where, duplicates);
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
