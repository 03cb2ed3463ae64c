// Constrained output (src/grammar): schema compilation and its errors, documents accepted and
// refused per keyword (hand-written), a differential check against an independent validator
// written here (a backtracking recursive-descent reader of the text driven by the schema JSON,
// plus a JSON Schema checker on the parsed value) over random schemas and documents, token masks
// against brute force (every token tried on a copy of the state), and what a random-weight model
// does: tokens drawn uniformly from the mask with the real Llama 3 and GPT-2 vocabularies.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "diffattn/base/rng.h"
#include "diffattn/data/data.h"
#include "diffattn/data/hf_tokenizer.h"
#include "diffattn/grammar/json_schema.h"
#include "diffattn/grammar/token_mask.h"
#include "grammar/program.h"
#include "temp_dir.h"

using namespace diffattn;
using namespace diffattn::grammar;
using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

Grammar compile(const std::string& text) { return Grammar::json_schema_text(text); }

bool accepts(const Grammar& g, std::string_view doc) {
  Matcher m(g);
  return m.advance(doc) && m.accepts_end();
}

// ---------------------------------------------------------------------------------------------
// The independent validator. It reads the schema JSON directly (nothing of src/grammar) and
// implements the documented language: JSON Schema's meaning (sem) plus the written form
// (whitespace, property order, one spelling of names, number lengths, compact enum texts,
// nesting).

uint32_t code_points(const std::string& s) {
  uint32_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

long double number_of(const json& v) {
  if (v.is_number_unsigned()) return static_cast<long double>(v.get<uint64_t>());
  if (v.is_number_integer()) return static_cast<long double>(v.get<int64_t>());
  return static_cast<long double>(v.get<double>());
}

int nesting_of(const json& v) {
  int d = 0;
  if (v.is_array() || v.is_object()) {
    for (const auto& e : v) d = std::max(d, nesting_of(e));
    return d + 1;
  }
  return 0;
}

class Validator {
 public:
  explicit Validator(ojson root) : root_(std::move(root)) {}

  bool accepts(const std::string& text) {
    t_ = text;
    steps_ = 0;
    memo_.clear();
    return value(root_, 0, 0).count(t_.size()) > 0;
  }

  // JSON Schema's meaning of the supported keywords, on a parsed value.
  bool sem(const json& v, const ojson& s, int guard = 0) const {
    if (guard > 200) return false;
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref") && !sem(v, resolve(s["$ref"].get<std::string>()), guard + 1)) return false;
    if (s.contains("anyOf")) {
      bool any = false;
      for (const ojson& a : s["anyOf"]) any = any || sem(v, a, guard + 1);
      if (!any) return false;
    }
    if (s.contains("enum")) {
      bool in = false;
      for (const ojson& e : s["enum"]) in = in || json::parse(e.dump()) == v;
      if (!in) return false;
    }
    if (s.contains("const") && json::parse(s["const"].dump()) != v) return false;
    if (s.contains("type")) {
      std::vector<std::string> types;
      if (s["type"].is_array()) {
        for (const ojson& x : s["type"]) types.push_back(x.get<std::string>());
      } else {
        types.push_back(s["type"].get<std::string>());
      }
      bool ok = false;
      for (const std::string& t : types) ok = ok || has_type(v, t);
      if (!ok) return false;
    }
    if (v.is_object()) {
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (s.contains("properties") && s["properties"].contains(it.key())) {
          if (!sem(it.value(), s["properties"][it.key()], guard + 1)) return false;
        } else if (s.contains("additionalProperties") && !sem(it.value(), s["additionalProperties"], guard + 1)) {
          return false;
        }
      }
      if (s.contains("required")) {
        for (const ojson& r : s["required"]) {
          if (!v.contains(r.get<std::string>())) return false;
        }
      }
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<uint64_t>()) return false;
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<uint64_t>()) return false;
      if (s.contains("items")) {
        for (const json& e : v) {
          if (!sem(e, s["items"], guard + 1)) return false;
        }
      }
    }
    if (v.is_string()) {
      const uint32_t n = code_points(v.get<std::string>());
      if (s.contains("minLength") && n < s["minLength"].get<uint64_t>()) return false;
      if (s.contains("maxLength") && n > s["maxLength"].get<uint64_t>()) return false;
    }
    if (v.is_number()) {
      const long double x = number_of(v);
      if (s.contains("minimum") && x < number_of(json::parse(s["minimum"].dump()))) return false;
      if (s.contains("maximum") && x > number_of(json::parse(s["maximum"].dump()))) return false;
      if (s.contains("exclusiveMinimum") && x <= number_of(json::parse(s["exclusiveMinimum"].dump()))) return false;
      if (s.contains("exclusiveMaximum") && x >= number_of(json::parse(s["exclusiveMaximum"].dump()))) return false;
    }
    return true;
  }

  const ojson& root() const { return root_; }

 private:
  using Ends = std::set<size_t>;
  static constexpr int kDepth = 32;

  static bool has_type(const json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "number") return v.is_number();
    if (t == "integer") {
      if (v.is_number_integer()) return true;
      return v.is_number_float() && std::floor(v.get<double>()) == v.get<double>();
    }
    return false;
  }

  // "#", "#/$defs/NAME" or "#/definitions/NAME", NAME percent-encoded and ~-escaped.
  const ojson& resolve(const std::string& ref) const {
    if (ref == "#") return root_;
    const size_t slash = ref.find('/', 2);
    std::string name, raw = ref.substr(slash + 1);
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '%' && i + 2 < raw.size()) {
        name += static_cast<char>(std::stoi(raw.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else if (raw[i] == '~') {
        name += raw[++i] == '0' ? '~' : '/';
      } else {
        name += raw[i];
      }
    }
    return root_.at(ref.substr(2, slash - 2)).at(name);
  }

  char at(size_t i) const { return i < t_.size() ? t_[i] : '\0'; }

  // Memoised on (schema node, position, depth): the schema nodes are the root's own, or any_.
  Ends value(const ojson& s, size_t i, int depth) {
    const auto key = std::make_tuple(&s, i, depth);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    Ends e = value_uncached(s, i, depth);
    memo_[key] = e;
    return e;
  }

  Ends value_uncached(const ojson& s, size_t i, int depth) {
    if (++steps_ > 2000000) throw std::runtime_error("validator: too many steps");
    struct Nest {  // a $ref or anyOf cycle that takes no byte would recurse without end
      int& n;
      explicit Nest(int& x) : n(x) {
        if (++n > 2000) throw std::runtime_error("validator: recursion without progress");
      }
      ~Nest() { --n; }
    } nest(nest_);
    if (s.is_boolean()) return s.get<bool>() ? value(any_, i, depth) : Ends{};
    if (s.contains("enum") || s.contains("const")) return literal(s, i, depth);
    if (s.contains("$ref")) return value(resolve(s["$ref"].get<std::string>()), i, depth);
    if (s.contains("anyOf")) {
      Ends out;
      for (const ojson& a : s["anyOf"]) {
        const Ends e = value(a, i, depth);
        out.insert(e.begin(), e.end());
      }
      return out;
    }
    std::vector<std::string> types = {"object", "array", "string", "integer", "number", "boolean", "null"};
    if (s.contains("type")) {
      types.clear();
      if (s["type"].is_array()) {
        for (const ojson& x : s["type"]) types.push_back(x.get<std::string>());
      } else {
        types.push_back(s["type"].get<std::string>());
      }
    }
    Ends out;
    for (const std::string& t : types) {
      Ends e;
      if (t == "object") e = object(s, i, depth);
      if (t == "array") e = array(s, i, depth);
      if (t == "string") e = string(s, i);
      if (t == "integer") e = number(s, i, true);
      if (t == "number") e = number(s, i, false);
      if (t == "boolean") e = word(i, {"true", "false"});
      if (t == "null") e = word(i, {"null"});
      out.insert(e.begin(), e.end());
    }
    return out;
  }

  Ends word(size_t i, std::initializer_list<const char*> words) const {
    Ends out;
    for (const char* w : words) {
      if (t_.compare(i, std::strlen(w), w) == 0) out.insert(i + std::strlen(w));
    }
    return out;
  }

  // enum/const: the compact texts of the values that the rest of the schema accepts; the
  // whole set counts with its deepest value's nesting.
  Ends literal(const ojson& s, size_t i, int depth) {
    ojson rest = s;
    rest.erase("enum");
    rest.erase("const");
    std::vector<ojson> values;
    if (s.contains("enum")) {
      for (const ojson& v : s["enum"]) values.push_back(v);
    }
    if (s.contains("const")) {
      if (s.contains("enum")) {
        std::vector<ojson> keep;
        for (const ojson& v : values) {
          if (json::parse(v.dump()) == json::parse(s["const"].dump())) keep.push_back(v);
        }
        values = keep;
      } else {
        values = {s["const"]};
      }
    }
    Ends out;
    int deepest = 0;
    std::vector<std::string> texts;
    for (const ojson& v : values) {
      if (!sem(json::parse(v.dump()), rest)) continue;
      deepest = std::max(deepest, nesting_of(json::parse(v.dump())));
      texts.push_back(v.dump());
    }
    if (depth + deepest > kDepth) return out;
    for (const std::string& text : texts) {
      if (t_.compare(i, text.size(), text) == 0) out.insert(i + text.size());
    }
    return out;
  }

  // A JSON string at i: its end, its decoded text; full escapes, strict UTF-8.
  bool read_string(size_t i, size_t& end, std::string& text) const {
    if (at(i) != '"') return false;
    size_t j = i + 1;
    text.clear();
    const auto put = [&](uint32_t cp) {
      if (cp < 0x80) {
        text += static_cast<char>(cp);
      } else if (cp < 0x800) {
        text += static_cast<char>(0xC0 | cp >> 6);
        text += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        text += static_cast<char>(0xE0 | cp >> 12);
        text += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
        text += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        text += static_cast<char>(0xF0 | cp >> 18);
        text += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
        text += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
        text += static_cast<char>(0x80 | (cp & 0x3F));
      }
    };
    const auto hex4 = [&](size_t k, uint32_t& v) {
      if (k + 4 > t_.size()) return false;
      v = 0;
      for (size_t q = k; q < k + 4; ++q) {
        const char c = t_[q];
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
        v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
      }
      return true;
    };
    for (;;) {
      if (j >= t_.size()) return false;
      const auto c = static_cast<unsigned char>(t_[j]);
      if (c == '"') {
        end = j + 1;
        return true;
      }
      if (c < 0x20) return false;
      if (c == '\\') {
        const char e = at(j + 1);
        const std::string simple = "\"\\/bfnrt";
        const std::string value = "\"\\/\b\f\n\r\t";
        if (simple.find(e) != std::string::npos && e != '\0') {
          text += value[simple.find(e)];
          j += 2;
          continue;
        }
        if (e != 'u') return false;
        uint32_t u;
        if (!hex4(j + 2, u)) return false;
        j += 6;
        if (u >= 0xDC00 && u <= 0xDFFF) return false;
        if (u >= 0xD800 && u <= 0xDBFF) {
          uint32_t lo;
          if (at(j) != '\\' || at(j + 1) != 'u' || !hex4(j + 2, lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
          j += 6;
          u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        }
        put(u);
        continue;
      }
      if (c < 0x80) {
        text += static_cast<char>(c);
        ++j;
        continue;
      }
      int len;
      uint32_t cp;
      if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
      else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
      else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
      else return false;
      if (j + static_cast<size_t>(len) > t_.size()) return false;
      for (int k = 1; k < len; ++k) {
        const auto d = static_cast<unsigned char>(t_[j + static_cast<size_t>(k)]);
        if ((d & 0xC0) != 0x80) return false;
        cp = cp << 6 | (d & 0x3F);
      }
      const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
      if (cp < least[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
      text.append(t_, j, static_cast<size_t>(len));
      j += static_cast<size_t>(len);
    }
  }

  Ends string(const ojson& s, size_t i) const {
    size_t end;
    std::string text;
    if (!read_string(i, end, text)) return {};
    const uint32_t n = code_points(text);
    if (s.contains("minLength") && n < s["minLength"].get<uint64_t>()) return {};
    if (s.contains("maxLength") && n > s["maxLength"].get<uint64_t>()) return {};
    return {end};
  }

  Ends number(const ojson& s, size_t i, bool integer) const {
    size_t j = i;
    if (at(j) == '-') ++j;
    const size_t int_start = j;
    if (at(j) == '0') {
      ++j;
    } else if (at(j) >= '1' && at(j) <= '9') {
      while (std::isdigit(static_cast<unsigned char>(at(j)))) ++j;
    } else {
      return {};
    }
    if (j - int_start > 19) return {};
    const std::string int_text = t_.substr(i, j - i);
    if (!integer) {
      if (at(j) == '.') {
        size_t k = j + 1;
        while (std::isdigit(static_cast<unsigned char>(at(k)))) ++k;
        if (k == j + 1 || k - j - 1 > 16) return {};
        j = k;
      }
      if (at(j) == 'e' || at(j) == 'E') {
        size_t k = j + 1;
        if (at(k) == '+' || at(k) == '-') ++k;
        const size_t d = k;
        while (std::isdigit(static_cast<unsigned char>(at(k)))) ++k;
        if (k == d || k - d > 2) return {};
        j = k;
      }
      return {j};
    }
    __int128 v = 0;
    for (char c : int_text) {
      if (c != '-') v = v * 10 + (c - '0');
    }
    if (int_text[0] == '-') v = -v;
    const long double x = static_cast<long double>(v);
    const auto bound = [&](const char* k) { return number_of(json::parse(s[k].dump())); };
    if (s.contains("minimum") && x < bound("minimum")) return {};
    if (s.contains("maximum") && x > bound("maximum")) return {};
    if (s.contains("exclusiveMinimum") && x <= bound("exclusiveMinimum")) return {};
    if (s.contains("exclusiveMaximum") && x >= bound("exclusiveMaximum")) return {};
    return {j};
  }

  Ends array(const ojson& s, size_t i, int depth) {
    if (depth + 1 > kDepth || at(i) != '[') return {};
    const ojson& items = s.contains("items") ? s["items"] : any_;
    const uint64_t lo = s.contains("minItems") ? s["minItems"].get<uint64_t>() : 0;
    const uint64_t hi = s.contains("maxItems") ? s["maxItems"].get<uint64_t>() : UINT64_MAX;
    Ends out;
    std::function<void(size_t, uint64_t)> rest = [&](size_t j, uint64_t count) {
      if (count >= lo && at(j) == ']') out.insert(j + 1);
      if (count >= hi) return;
      std::vector<size_t> starts;
      if (count == 0) {
        starts = {j};
      } else if (at(j) == ',') {
        starts = {j + 1};
        if (at(j + 1) == ' ') starts.push_back(j + 2);
      }
      for (size_t k : starts) {
        for (size_t e : value(items, k, depth + 1)) rest(e, count + 1);
      }
    };
    rest(i + 1, 0);
    return out;
  }

  Ends object(const ojson& s, size_t i, int depth) {
    if (depth + 1 > kDepth || at(i) != '{') return {};
    struct Decl {
      std::string name;
      const ojson* schema;
      bool required;
    };
    std::vector<Decl> decl;
    const ojson& additional = s.contains("additionalProperties") ? s["additionalProperties"] : any_;
    if (s.contains("properties")) {
      for (const auto& [name, sub] : s["properties"].items()) decl.push_back({name, &sub, false});
    }
    if (s.contains("required")) {
      for (const ojson& r : s["required"]) {
        const std::string name = r.get<std::string>();
        bool found = false;
        for (Decl& d : decl) {
          if (d.name == name) d.required = found = true;
        }
        if (!found) decl.push_back({name, &additional, true});
      }
    }
    const auto required_from = [&](size_t p, size_t q) {  // a required one in [p, q)
      for (size_t k = p; k < q && k < decl.size(); ++k) {
        if (decl[k].required) return true;
      }
      return false;
    };
    const bool extras = !(additional.is_boolean() && !additional.get<bool>());
    Ends out;
    std::function<void(size_t, size_t, bool)> members = [&](size_t j, size_t p, bool first) {
      if (!required_from(p, decl.size()) && at(j) == '}') out.insert(j + 1);
      std::vector<size_t> starts;
      if (first) {
        starts = {j};
      } else if (at(j) == ',') {
        starts = {j + 1};
        if (at(j + 1) == ' ') starts.push_back(j + 2);
      }
      for (size_t k : starts) {
        size_t end;
        std::string name;
        if (!read_string(k, end, name)) continue;
        if (json(name).dump() != t_.substr(k, end - k)) continue;  // one spelling per name
        size_t q = decl.size();
        for (size_t d = 0; d < decl.size(); ++d) {
          if (decl[d].name == name) q = d;
        }
        const ojson* sub = &additional;
        size_t next = p;
        if (q < decl.size()) {
          if (q < p || required_from(p, q)) continue;
          sub = decl[q].schema;
          next = q + 1;
        } else if (!extras) {
          continue;
        }
        if (at(end) != ':') continue;
        std::vector<size_t> vstarts = {end + 1};
        if (at(end + 1) == ' ') vstarts.push_back(end + 2);
        for (size_t v : vstarts) {
          for (size_t e : value(*sub, v, depth + 1)) members(e, next, false);
        }
      }
    };
    members(i + 1, 0, true);
    return out;
  }

  ojson root_;
  const ojson any_ = ojson::object();
  std::string t_;
  uint64_t steps_ = 0;
  int nest_ = 0;
  std::map<std::tuple<const ojson*, size_t, int>, Ends> memo_;
};

// ---------------------------------------------------------------------------------------------
// Compilation and its errors.

struct BadSchema {
  const char* schema;
  const char* keyword;
  const char* path;
};

TEST(JsonSchemaCompile, UnsupportedKeywordsAreNamedWithTheirPath) {
  const BadSchema cases[] = {
      {R"({"type":"string","pattern":"^a"})", "pattern", "/pattern"},
      {R"({"type":"object","properties":{"d":{"type":"string","format":"date"}}})", "format", "/properties/d/format"},
      {R"({"oneOf":[{"type":"string"}]})", "oneOf", "/oneOf"},
      {R"({"allOf":[true]})", "allOf", "/allOf"},
      {R"({"not":{"type":"null"}})", "not", "/not"},
      {R"({"if":{"type":"string"},"then":{"minLength":1}})", "if", "/if"},
      {R"({"type":"object","then":{}})", "then", "/then"},
      {R"({"else":{}})", "else", "/else"},
      {R"({"type":"object","dependentRequired":{"a":["b"]}})", "dependentRequired", "/dependentRequired"},
      {R"({"type":"object","dependentSchemas":{}})", "dependentSchemas", "/dependentSchemas"},
      {R"({"type":"object","dependencies":{}})", "dependencies", "/dependencies"},
      {R"({"type":"object","minProperties":1})", "minProperties", "/minProperties"},
      {R"({"type":"object","maxProperties":1})", "maxProperties", "/maxProperties"},
      {R"({"type":"object","patternProperties":{"^x":{}}})", "patternProperties", "/patternProperties"},
      {R"({"type":"object","propertyNames":{"maxLength":3}})", "propertyNames", "/propertyNames"},
      {R"({"type":"object","unevaluatedProperties":false})", "unevaluatedProperties", "/unevaluatedProperties"},
      {R"({"type":"array","unevaluatedItems":false})", "unevaluatedItems", "/unevaluatedItems"},
      {R"({"type":"array","prefixItems":[{}]})", "prefixItems", "/prefixItems"},
      {R"({"type":"array","contains":{}})", "contains", "/contains"},
      {R"({"type":"array","minContains":1})", "minContains", "/minContains"},
      {R"({"type":"array","maxContains":1})", "maxContains", "/maxContains"},
      {R"({"type":"array","additionalItems":false})", "additionalItems", "/additionalItems"},
      {R"({"type":"array","items":[{"type":"string"}]})", "items", "/items"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems", "/uniqueItems"},
      {R"({"type":"number","multipleOf":2})", "multipleOf", "/multipleOf"},
      {R"({"type":"number","minimum":0})", "minimum", "/minimum"},
      {R"({"type":["integer","number"],"maximum":3})", "maximum", "/maximum"},
      {R"({"exclusiveMinimum":0})", "exclusiveMinimum", "/exclusiveMinimum"},
      {R"({"type":"string","contentEncoding":"base64"})", "contentEncoding", "/contentEncoding"},
      {R"({"type":"string","contentMediaType":"text/html"})", "contentMediaType", "/contentMediaType"},
      {R"({"$ref":"other.json#/x"})", "$ref", "/$ref"},
      {R"({"$defs":{"a":{"$defs":{"b":{}}}},"$ref":"#/$defs/a/$defs/b"})", "$ref", "/$ref"},
      {R"({"$ref":"#/properties/a","properties":{"a":{}}})", "$ref", "/$ref"},
      {R"({"type":"object","properties":{"a":{"$id":"x"}}})", "$id", "/properties/a/$id"},
      {R"({"$anchor":"x"})", "$anchor", "/$anchor"},
      {R"({"$dynamicRef":"#x"})", "$dynamicRef", "/$dynamicRef"},
      {R"({"anyOf":[{"type":"string"}],"type":"string"})", "anyOf", "/anyOf"},
      {R"({"$defs":{"a":{}},"$ref":"#/$defs/a","minLength":1})", "$ref", "/$ref"},
      {R"({"nullable":true,"type":"string"})", "nullable", "/nullable"},
      {R"({"properties":{"a/b":{"properties":{"c~d":{"x-extra":1}}}}})", "x-extra", "/properties/a~1b/properties/c~0d/x-extra"},
      {R"({"$defs":{"n":{"type":"string","pattern":"x"}},"$ref":"#/$defs/n"})", "pattern", "/$defs/n/pattern"},
      {R"({"anyOf":[{"type":"string"},{"type":"integer","multipleOf":3}]})", "multipleOf", "/anyOf/1/multipleOf"},
      {R"({"type":"array","items":{"type":"object","additionalProperties":{"format":"uri"}}})", "format",
       "/items/additionalProperties/format"},
  };
  for (const BadSchema& c : cases) {
    try {
      compile(c.schema);
      ADD_FAILURE() << "compiled: " << c.schema;
    } catch (const UnsupportedSchema& e) {
      EXPECT_EQ(e.keyword(), c.keyword) << c.schema;
      EXPECT_EQ(e.path(), c.path) << c.schema;
      EXPECT_NE(std::string(e.what()).find(c.keyword), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.path), std::string::npos) << e.what();
    }
  }
}

TEST(JsonSchemaCompile, InvalidSchemasAreSchemaErrorsNamingTheKeyword) {
  const BadSchema cases[] = {
      {R"({"type":"strin"})", "type", "/type"},
      {R"({"type":[]})", "type", "/type"},
      {R"({"type":["string",3]})", "type", "/type"},
      {R"({"type":"array","minItems":-1})", "minItems", "/minItems"},
      {R"({"type":"string","maxLength":1.5})", "maxLength", "/maxLength"},
      {R"({"type":"string","maxLength":"3"})", "maxLength", "/maxLength"},
      {R"({"properties":[]})", "properties", "/properties"},
      {R"({"type":"object","required":"a"})", "required", "/required"},
      {R"({"type":"object","required":[1]})", "required", "/required"},
      {R"({"anyOf":[]})", "anyOf", "/anyOf"},
      {R"({"anyOf":{}})", "anyOf", "/anyOf"},
      {R"({"$ref":3})", "$ref", "/$ref"},
      {R"({"$ref":"#/$defs/missing"})", "$ref", "/$ref"},
      {R"({"$ref":"#/definitions/a~2"})", "$ref", "/$ref"},
      {R"({"enum":3})", "enum", "/enum"},
      {R"({"type":"array","uniqueItems":"no"})", "uniqueItems", "/uniqueItems"},
      {R"({"type":"integer","minimum":"3"})", "minimum", "/minimum"},
      {R"(3)", "", ""},
      {R"({"properties":{"a":7}})", "", "/properties/a"},
      {R"({"$defs":[]})", "$defs", "/$defs"},
  };
  for (const BadSchema& c : cases) {
    try {
      compile(c.schema);
      ADD_FAILURE() << "compiled: " << c.schema;
    } catch (const UnsupportedSchema& e) {
      ADD_FAILURE() << "unsupported instead of invalid: " << e.what();
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword(), c.keyword) << c.schema << ": " << e.what();
      EXPECT_EQ(e.path(), c.path) << c.schema << ": " << e.what();
    }
  }
}

TEST(JsonSchemaCompile, SchemasWithoutAFinishableDocumentAreRefused) {
  const char* cases[] = {
      "false",
      R"({"enum":[]})",
      R"({"type":"object","required":["a"],"additionalProperties":false})",
      R"({"type":"object","properties":{"a":false},"required":["a"]})",
      R"({"type":"array","minItems":3,"maxItems":2})",
      R"({"type":"string","minLength":3,"maxLength":2})",
      R"({"type":"string","enum":[1,2]})",
      R"({"type":"integer","minimum":5,"maximum":4})",
      R"({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})",
      R"({"const":"a","enum":["b"]})",
      // Recursion without a way out.
      R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}},"required":["next"]}},"$ref":"#/$defs/n"})",
      R"({"anyOf":[{"$ref":"#"}]})",
  };
  for (const char* c : cases) {
    EXPECT_THROW(compile(c), SchemaError) << c;
  }
  // 32 levels of required arrays fit; 33 do not.
  std::string s32 = R"({"type":"integer"})", s33;
  for (int i = 0; i < 32; ++i) s32 = R"({"type":"array","minItems":1,"items":)" + s32 + "}";
  s33 = R"({"type":"array","minItems":1,"items":)" + s32 + "}";
  const Grammar g = compile(s32);
  EXPECT_TRUE(accepts(g, std::string(32, '[') + "7" + std::string(32, ']')));
  EXPECT_THROW(compile(s33), SchemaError);
}

TEST(JsonSchemaCompile, LimitsOnSchemaSize) {
  // Too many compiled parts.
  ojson big = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 11000; ++i) big["properties"]["p" + std::to_string(i)] = {{"type", "integer"}};
  try {
    Grammar::json_schema(big);
    ADD_FAILURE() << "compiled 11000 properties";
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
  }
  // Schemas nested deeper than kMaxSchemaDepth (built in C++, past the text parser's guard).
  ojson deep = {{"type", "integer"}};
  for (int i = 0; i < kMaxSchemaDepth + 2; ++i) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_THROW(Grammar::json_schema(deep), SchemaError);
  // Text nested deeper than 64 levels is refused by the parser.
  EXPECT_THROW(compile(std::string(100, '[') + std::string(100, ']')), InvalidArgument);
  EXPECT_THROW(compile("{\"type\":"), InvalidArgument);
  // More than kMaxAlternatives ways to start one value.
  ojson alts = ojson::array();
  for (int i = 0; i < 40; ++i) alts.push_back({{"type", ojson::array({"string", "integer"})}, {"maxLength", i}});
  try {
    Grammar::json_schema(ojson{{"anyOf", alts}});
    ADD_FAILURE() << "compiled 80 alternatives";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.keyword(), "anyOf") << e.what();
  }
  // Enum texts beyond kMaxLiteralBytes.
  ojson e = ojson::array({std::string(kMaxLiteralBytes + 1, 'x')});
  EXPECT_THROW(Grammar::json_schema(ojson{{"enum", e}}), SchemaError);
  // A huge enum within the limit compiles and works.
  ojson many = ojson::array();
  for (int i = 0; i < 20000; ++i) many.push_back("v" + std::to_string(i));
  const Grammar g = Grammar::json_schema(ojson{{"enum", many}});
  EXPECT_TRUE(accepts(g, "\"v19999\""));
  EXPECT_FALSE(accepts(g, "\"v20000\""));
}

TEST(JsonSchemaCompile, PropertyOrderFollowsTheSchemaAsWritten) {
  const char* text = R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"integer"}},"additionalProperties":false})";
  const Grammar written = compile(text);
  EXPECT_TRUE(accepts(written, R"({"zeta":1,"alpha":2})"));
  EXPECT_FALSE(accepts(written, R"({"alpha":2,"zeta":1})"));
  // nlohmann::json keeps names sorted: that order is the one it has.
  const Grammar sorted = Grammar::json_schema(json::parse(text));
  EXPECT_TRUE(accepts(sorted, R"({"alpha":2,"zeta":1})"));
  EXPECT_FALSE(accepts(sorted, R"({"zeta":1,"alpha":2})"));
  // A C++ json holding invalid UTF-8 is an error, not a crash.
  EXPECT_THROW(Grammar::json_schema(json{{"enum", json::array({std::string("\xff")})}}), SchemaError);
}

// ---------------------------------------------------------------------------------------------
// Documents accepted and refused, by hand.

struct Case {
  const char* schema;
  std::vector<std::string> yes, no;
};

void check_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    const Grammar g = compile(c.schema);
    Validator v(ojson::parse(c.schema));
    for (const std::string& d : c.yes) {
      EXPECT_TRUE(accepts(g, d)) << c.schema << "\n  should accept: " << d;
      EXPECT_TRUE(v.accepts(d)) << "validator disagrees: " << c.schema << "\n  " << d;
    }
    for (const std::string& d : c.no) {
      EXPECT_FALSE(accepts(g, d)) << c.schema << "\n  should refuse: " << d;
      EXPECT_FALSE(v.accepts(d)) << "validator disagrees: " << c.schema << "\n  " << d;
    }
  }
}

const char* kColor = R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]}},"required":["color"],"additionalProperties":false})";

TEST(JsonSchemaDocuments, ObjectsAndTheWhitespaceRule) {
  check_cases({
      {kColor,
       {R"({"color":"red"})", R"({"color": "green"})", R"({"color":"blue"})"},
       {R"({"color":"yellow"})", R"({})", R"({"color":"red","x":1})", R"({ "color":"red"})", R"({"color" :"red"})",
        R"({"color":  "red"})", "{\"color\":\"red\"}\n", " {\"color\":\"red\"}", "{\"color\":\"red\"} ",
        "{\"color\":\n\"red\"}", "{\"color\":\t\"red\"}", R"({"color":"red",})", R"({"color":"red"})" "x",
        R"({"color":"red","color":"red"})", R"({"colour":"red"})", R"({"color":red})", R"({"color":"red" })",
        R"({"color":"RED"})", R"({"\u0063olor":"red"})", R"("red")", ""}},
      {R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"},"c":{"type":"boolean"}},"required":["a"],"additionalProperties":false})",
       {R"({"b":1,"a":"x"})", R"({"a":"x"})", R"({"b": 1, "a": "x", "c": true})", R"({"a":"x","c":false})"},
       {R"({"a":"x","b":1})", R"({"b":1})", R"({"b":1,"b":2,"a":"x"})", R"({})", R"({"a":"x","d":1})",
        R"({"c":true,"a":"x"})", R"({"b":1,  "a":"x"})", R"({"b":1 ,"a":"x"})"}},
      // additionalProperties absent: other names anywhere, with any value, one spelling.
      {R"({"type":"object","properties":{"a":{"type":"integer"}}})",
       {R"({"x":1,"a":2})", R"({"a":2,"x":[true,{"y":null}]})", R"({})", R"({"x":{"y":"z"}})",
        R"({"x\n":1})", R"({"\u001f":1})", R"({"é😀":1})", R"({"x":1,"x":2})", R"({"":0})"},
       {R"({"a":"s"})", R"({"\u0061":1})", R"({"x\u0041":1})", R"({"\u001F":1})", R"({"\/":1})",
        R"({"a":1,"a":1})", R"({"x":1,"a":2,"a":3})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {R"({"a":1,"b":2})", R"({})"},
       {R"({"a":"x"})", R"({"a":1,"b":null})"}},
      {R"({"type":"object","additionalProperties":true,"properties":{"k":{"const":1}},"required":["k"]})",
       {R"({"k":1})", R"({"z":false,"k":1})", R"({"k":1,"z":[]})"},
       {R"({"z":false})", R"({"k":2})"}},
      // Required but not declared: its value follows additionalProperties.
      {R"({"type":"object","required":["k"],"additionalProperties":{"type":"boolean"}})",
       {R"({"k":true})", R"({"z":false,"k":true})", R"({"k":true,"z":false})"},
       {R"({"z":false})", R"({"k":1})", R"({})"}},
      {R"({"type":"object","properties":{"a":false,"b":{}},"additionalProperties":true})",
       {R"({"b":1})", R"({"c":1})"},
       {R"({"a":1})", R"({"a":null,"b":1})"}},
      // json_object-like schemas.
      {R"({"type":"object"})",
       {R"({})", R"({"a":[1,{"b":"c"}],"d":null})"},
       {R"([])", R"(1)", R"("x")", R"({"a" : 1})"}},
  });
}

TEST(JsonSchemaDocuments, ArraysStringsNumbersLiterals) {
  check_cases({
      {R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
       {"[1]", "[1,2,3]", "[1, 2, 3]", "[-1, 0]"},
       {"[]", "[1,2,3,4]", "[ 1]", "[1 ]", "[1 ,2]", "[1,,2]", "[1,]", "[\"a\"]", "[1,  2]", "[1.5]"}},
      {R"({"type":"array"})", {"[]", "[1,\"a\",[null],{}]"}, {"[", "{}"}},
      {R"({"type":"string","minLength":2,"maxLength":3})",
       {R"("ab")", R"("abc")", "\"é😀\"", R"("\u00e9x")", R"("\ud83d\ude00x")", R"("a\"")", R"("\n\t")"},
       {R"("a")", R"("abcd")", R"("\ud83d")", R"("\ude00")", R"("\ud83dx")", "\"a\x01\"", "\"a\nb\"", R"("\x")",
        "\"\xC0\xAFz\"", "\"\xED\xA0\x80z\"", "\"\xF4\x90\x80\x80z\"", "\"\xE0\x80\xAFz\"", "\"\xC3\"", "\"\xFF" "ab\"",
        R"("\ud83d\u0041")", R"("\uDC00a")", R"("abc)"}},
      {R"({"type":"string"})",
       {R"("")", R"("\"\\\/\b\f\n\r\t\u0041\uD83D\uDE00")", "\"\x7f\"", "\"日本語\""},
       {R"("\a")", R"("\u12")", R"("\U0041")", "\"\t\"", R"(")", R"(x)"}},
      {R"({"type":"number"})",
       {"0", "-0", "1.5", "-1.5e10", "1E+2", "1e-2", "1234567890123456789", "0.1234567890123456", "1e99", "-0.0"},
       {"01", "1.", ".5", "+1", "1e", "--1", "-", "1.5.5", "NaN", "Infinity", "12345678901234567890",
        "0.12345678901234567", "1e100", "1e+100", "0x10", "1 ", " 1", "\"1\""}},
      {R"({"type":"integer"})", {"0", "-0", "42", "-7", "9999999999999999999"}, {"1.0", "1e2", "01", "-", "10000000000000000000"}},
      {R"({"type":"integer","minimum":-5,"exclusiveMaximum":10})", {"-5", "0", "9", "-0"}, {"-6", "10", "100", "-50"}},
      {R"({"type":"integer","exclusiveMinimum":1.5,"maximum":3.7})", {"2", "3"}, {"1", "4", "30", "-2"}},
      {R"({"type":"integer","minimum":100})", {"100", "5000000"}, {"99", "0", "-100"}},
      {R"({"type":"integer","maximum":-100})", {"-100", "-5000000"}, {"-99", "0", "100"}},
      {R"({"type":"boolean"})", {"true", "false"}, {"null", "True", "1", "tru", "truee"}},
      {R"({"type":"null"})", {"null"}, {"nul", "false"}},
      {R"({"enum":["red",1,null,[1,2],{"a":1},1.5]})",
       {R"("red")", "1", "null", "[1,2]", R"({"a":1})", "1.5"},
       {R"("blue")", "1.0", "[1, 2]", "2", R"({"a": 1})", "[1,2,3]", "1.50"}},
      {R"({"type":"string","enum":["a","b",1]})", {R"("a")", R"("b")"}, {"1", R"("c")"}},
      {R"({"const":"x"})", {R"("x")"}, {R"("y")"}},
      {R"({"enum":["a","ab",2],"maxLength":1})", {R"("a")", "2"}, {R"("ab")"}},
      {R"({"type":"integer","enum":[1.0,2.5,3]})", {"1.0", "3"}, {"2.5", "1"}},
      {R"({"enum":[1,12,123]})", {"1", "12", "123"}, {"1234", "13"}},
      {R"({"type":["string","null"]})", {R"("x")", "null"}, {"1", "[]"}},
      {R"({"type":["integer","number"]})", {"1", "1.5"}, {"\"1\""}},
      {R"({"anyOf":[{"type":"integer"},{"type":"number","description":"n"}]})", {"1", "1.5", "-2e3"}, {"true"}},
      {R"({"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},
                    {"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false},
                    {"type":"null"}]})",
       {R"({"a":1})", R"({"a":"x"})", "null"},
       {R"({"a":null})", R"({})"}},
      {R"({"anyOf":[{"enum":["x"]},{"type":"string","maxLength":0}]})", {R"("x")", R"("")"}, {R"("y")"}},
      {"true", {"1", R"({"a":[]})", "null"}, {"", "tru"}},
      {"{}", {"1", R"({"a":[]})", "\"s\""}, {"{]"}},
      {R"({"description":"d","title":"t","examples":[1],"default":2,"$comment":"c","$schema":"x","$id":"y","type":"integer"})",
       {"5"}, {"\"5\""}},
  });
}

TEST(JsonSchemaDocuments, RefsAndRecursion) {
  const char* tree = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"],"additionalProperties":false}},"$ref":"#/$defs/node"})";
  const char* linked = R"({"type":"object","properties":{"next":{"$ref":"#"}},"additionalProperties":false})";
  const char* defs = R"({"definitions":{"a b":{"type":"integer"},"x/y":{"type":"string"}},"type":"array","items":{"anyOf":[{"$ref":"#/definitions/a%20b"},{"$ref":"#/definitions/x~1y"}]}})";
  check_cases({
      {tree,
       {R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"},
       {R"({"kids":[],"v":1})", R"({"v":1})", R"({"v":1,"kids":[{}]})"}},
      {linked, {"{}", R"({"next":{}})", R"({"next":{"next":{}}})"}, {R"({"next":null})"}},
      {defs, {"[1,\"a\"]", "[]"}, {"[true]"}},
  });
  // Nesting: 32 levels of objects are a document, 33 are not, and the 32nd level offers no
  // "next" (its value could not be finished).
  const Grammar g = compile(linked);
  std::string d32 = "{}", d33;
  for (int i = 1; i < 32; ++i) d32 = R"({"next":)" + d32 + "}";
  d33 = R"({"next":)" + d32 + "}";
  EXPECT_TRUE(accepts(g, d32));
  EXPECT_FALSE(accepts(g, d33));
  Matcher m(g);
  std::string prefix;
  for (int i = 0; i < 31; ++i) prefix += R"({"next":)";
  ASSERT_TRUE(m.advance(prefix));
  ASSERT_TRUE(m.advance("{"));
  EXPECT_EQ(m.allowed_bytes(), std::bitset<256>().set('}'));
}

// Alternatives that stay ambiguous level after level: the parses alive are capped at
// kMaxParses (the later ones dropped), and what is left can always be finished and is valid.
TEST(JsonSchemaMatcher, AmbiguousParsesAreCappedAndStayFinishable) {
  const char* schema = R"({"anyOf":[
      {"type":"object","properties":{"a":{"$ref":"#"}},"additionalProperties":false},
      {"type":"object","properties":{"a":{"$ref":"#"},"b":{"type":"integer"}},"additionalProperties":false},
      {"type":"object","properties":{"a":{"anyOf":[{"$ref":"#"},{"type":"null"}]}}}]})";
  const Grammar g = compile(schema);
  Validator v(ojson::parse(schema));
  Matcher m(g);
  size_t most = 0;
  for (int level = 0; level < 25; ++level) {
    ASSERT_TRUE(m.advance(R"({"a":)")) << level;
    most = std::max(most, m.state().n);
    ASSERT_LE(m.state().n, kMaxParses);  // else a regression would run exponentially long
  }
  EXPECT_EQ(most, kMaxParses);  // the cap was reached
  // Finish by taking allowed bytes only (closing ones first): the result is a valid document.
  std::string doc;
  for (int level = 0; level < 25; ++level) doc += R"({"a":)";
  for (int guard = 0; guard < 200 && !m.accepts_end(); ++guard) {
    const std::bitset<256> a = m.allowed_bytes();
    ASSERT_TRUE(a.any()) << doc;
    char c = 0;
    for (const char* pref = "}n{ul"; *pref && !c; ++pref) {
      if (a[static_cast<uint8_t>(*pref)]) c = *pref;
    }
    if (!c) {
      for (int b = 0; b < 256 && !c; ++b) {
        if (a[static_cast<size_t>(b)]) c = static_cast<char>(b);
      }
    }
    ASSERT_TRUE(m.advance(std::string_view(&c, 1)));
    doc += c;
  }
  ASSERT_TRUE(m.accepts_end()) << doc;
  EXPECT_TRUE(v.accepts(doc)) << doc;
  EXPECT_TRUE(v.sem(json::parse(doc), ojson::parse(schema))) << doc;
}

TEST(JsonSchemaMatcher, AdvanceIsAllOrNothingAndEndIsFinal) {
  const Grammar g = compile(kColor);
  Matcher m(g);
  EXPECT_EQ(m.allowed_bytes(), std::bitset<256>().set('{'));
  ASSERT_TRUE(m.advance(R"({"col)"));
  const std::bitset<256> before = m.allowed_bytes();
  EXPECT_EQ(before, std::bitset<256>().set('o'));
  EXPECT_FALSE(m.advance("ox"));  // 'o' fits, 'x' does not: nothing taken
  EXPECT_EQ(m.allowed_bytes(), before);
  Matcher copy = m.clone();
  ASSERT_TRUE(m.advance(R"(or":"gr)"));
  EXPECT_EQ(copy.allowed_bytes(), before);  // copies are independent
  EXPECT_FALSE(m.accepts_end());
  EXPECT_FALSE(m.end());
  ASSERT_TRUE(m.advance(R"(een"})"));
  EXPECT_TRUE(m.accepts_end());
  EXPECT_TRUE(m.allowed_bytes().none());  // nothing after the document, not even a space
  EXPECT_TRUE(m.end());
  EXPECT_TRUE(m.ended());
  EXPECT_FALSE(m.accepts_end());
  EXPECT_FALSE(m.advance("x"));
  EXPECT_TRUE(m.allowed_bytes().none());
  // A number at the top level is complete and may still grow.
  Matcher n(compile(R"({"type":"integer"})"));
  ASSERT_TRUE(n.advance("12"));
  EXPECT_TRUE(n.accepts_end());
  EXPECT_TRUE(n.allowed_bytes()['3']);
  // json_object
  Matcher o(Grammar::json_object());
  EXPECT_EQ(o.allowed_bytes(), std::bitset<256>().set('{'));
  EXPECT_TRUE(accepts(Grammar::json_object(), R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(accepts(Grammar::json_object(), "[]"));
}

// ---------------------------------------------------------------------------------------------
// The differential check: random schemas, random documents (mostly near the schema, then
// mutated), the matcher against the validator.

class SchemaGen {
 public:
  explicit SchemaGen(uint64_t seed) : r_(seed) {}

  ojson schema() {
    defs_ = ojson::object();
    ojson s = node(0);
    if (r_.below(3) == 0) {
      // A recursive definition with a way out, referred to from an optional place.
      defs_["rec"] = {{"type", "object"},
                      {"properties", {{"v", {{"type", "integer"}, {"minimum", -3}, {"maximum", 3}}},
                                      {"child", {{"$ref", "#/$defs/rec"}}}}},
                      {"additionalProperties", false}};
      s = {{"anyOf", ojson::array({s, {{"$ref", "#/$defs/rec"}}})}};
    }
    if (!defs_.empty()) s["$defs"] = defs_;
    return s;
  }

 private:
  std::string name() {
    static const char* names[] = {"a", "b", "name", "x y", "q\"t", "é", "tab\t", "sl/ash", "til~de", "c", "", "\\"};
    return names[r_.below(std::size(names))];
  }

  ojson scalar_value() {
    switch (r_.below(7)) {
      case 0: return "red";
      case 1: return "a\"b\\é\n";
      case 2: return static_cast<int>(r_.below(20)) - 5;
      case 3: return 1.5;
      case 4: return nullptr;
      case 5: return r_.below(2) == 0;
      default: return "";
    }
  }

  ojson literal_value() {
    if (r_.below(5) == 0) return ojson::array({scalar_value(), scalar_value()});
    if (r_.below(6) == 0) return {{name(), scalar_value()}};
    return scalar_value();
  }

  ojson node(int depth) {
    const uint64_t k = r_.below(depth >= 3 ? 7 : 14);
    switch (k) {
      case 0: {
        ojson s = {{"type", "string"}};
        if (r_.below(2)) s["minLength"] = r_.below(3);
        if (r_.below(2)) s["maxLength"] = 2 + r_.below(4);
        return s;
      }
      case 1: {
        ojson s = {{"type", "integer"}};
        if (r_.below(2)) s["minimum"] = static_cast<int>(r_.below(30)) - 10;
        if (r_.below(2)) s["exclusiveMaximum"] = static_cast<int>(r_.below(300)) + 20;
        return s;
      }
      case 2: return {{"type", "number"}};
      case 3: return {{"type", r_.below(2) ? "boolean" : "null"}};
      case 4: {
        ojson e = ojson::array();
        for (uint64_t i = 0, n = 1 + r_.below(4); i < n; ++i) e.push_back(literal_value());
        ojson s = {{"enum", e}};
        if (r_.below(3) == 0) s["type"] = "string";
        return s;
      }
      case 5: return {{"const", literal_value()}};
      case 6: return r_.below(2) ? ojson(true) : ojson::object();
      case 7:
      case 8: {
        ojson s = {{"type", "object"}, {"properties", ojson::object()}};
        std::vector<std::string> names;
        for (uint64_t i = 0, n = r_.below(4); i < n; ++i) {
          const std::string nm = name();
          s["properties"][nm] = node(depth + 1);
          names.push_back(nm);
        }
        ojson req = ojson::array();
        for (const std::string& nm : names) {
          if (r_.below(2)) req.push_back(nm);
        }
        if (r_.below(6) == 0) req.push_back("extra");
        if (!req.empty()) s["required"] = req;
        switch (r_.below(4)) {
          case 0: s["additionalProperties"] = false; break;
          case 1: s["additionalProperties"] = true; break;
          case 2: s["additionalProperties"] = node(depth + 1); break;
          default: break;
        }
        return s;
      }
      case 9:
      case 10: {
        ojson s = {{"type", "array"}};
        if (r_.below(4)) s["items"] = node(depth + 1);
        if (r_.below(2)) s["minItems"] = r_.below(2);
        if (r_.below(2)) s["maxItems"] = 1 + r_.below(3);
        return s;
      }
      case 11: {
        ojson a = ojson::array();
        for (uint64_t i = 0, n = 2 + r_.below(2); i < n; ++i) a.push_back(node(depth + 1));
        return {{"anyOf", a}};
      }
      case 12: {
        static const char* types[] = {"string", "integer", "number", "boolean", "null", "object", "array"};
        ojson t = ojson::array();
        for (uint64_t i = 0, n = 1 + r_.below(3); i < n; ++i) t.push_back(types[r_.below(7)]);
        ojson s = {{"type", t}};
        if (r_.below(2)) s["maxLength"] = 3;
        if (r_.below(2)) s["maxItems"] = 2;
        return s;
      }
      default: {
        const std::string d = "d" + std::to_string(defs_.size());
        defs_[d] = nullptr;  // the name is taken before the body (which may add others)
        defs_[d] = node(depth + 1);
        return {{"$ref", "#/$defs/" + d}};
      }
    }
  }

  Rng r_;
  ojson defs_;
};

// A document for schema s, usually valid, written in random (mostly allowed) forms.
class DocGen {
 public:
  DocGen(const ojson& root, uint64_t seed) : root_(root), r_(seed) {}

  std::string doc() {
    std::string out;
    value(root_, out, 0);
    if (r_.below(3) == 0) mutate(out);
    return out;
  }

 private:
  bool coin(uint64_t one_in) { return r_.below(one_in) == 0; }

  std::string space() {  // after ':' or ','
    if (coin(25)) {
      static const char* bad[] = {"  ", "\n", "\t", " \n"};
      return bad[r_.below(4)];
    }
    return coin(2) ? " " : "";
  }

  void string_value(std::string& out, uint64_t lo, uint64_t hi) {
    uint64_t n = lo + r_.below(std::min<uint64_t>(hi, lo + 5) - lo + 1);
    if (coin(15)) n += 1;
    out += '"';
    for (uint64_t i = 0; i < n; ++i) {
      static const char* pieces[] = {"a", "Z", " ", "é", "😀", "\\n", "\\\"", "\\\\", "\\/", "\\u00e9", "\\ud83d\\ude00",
                                     "\\u0041", "\x7f", "日"};
      static const char* bad[] = {"\\ud83d", "\x01", "\n", "\\x", "\xC3", "\xED\xA0\x80", "\\uDC00"};
      out += coin(40) ? bad[r_.below(std::size(bad))] : pieces[r_.below(std::size(pieces))];
    }
    out += '"';
  }

  void number_value(std::string& out, bool integer) {
    static const char* forms[] = {"0", "-0", "7", "-12", "1.5", "-0.25", "3e2", "1E-5", "2.5e+10", "123456789"};
    static const char* bad[] = {"01", "1.", ".5", "+1", "1e", "12345678901234567890", "1e100", "0.12345678901234567"};
    if (coin(20)) {
      out += bad[r_.below(std::size(bad))];
    } else if (integer) {
      out += std::to_string(static_cast<int>(r_.below(400)) - 30);
    } else {
      out += forms[r_.below(std::size(forms))];
    }
  }

  void any_value(std::string& out, int depth) {
    const uint64_t k = r_.below(depth > 2 ? 5 : 7);
    if (k == 0) string_value(out, 0, 3);
    else if (k == 1) number_value(out, false);
    else if (k == 2) out += "true";
    else if (k == 3) out += "false";
    else if (k == 4) out += "null";
    else value(k == 5 ? ojson{{"type", "object"}} : ojson{{"type", "array"}}, out, depth);
  }

  const ojson& resolve(const std::string& ref) const {
    if (ref == "#") return root_;
    const size_t slash = ref.find('/', 2);
    return root_[ref.substr(2, slash - 2)][ref.substr(slash + 1)];
  }

  void value(const ojson& s, std::string& out, int depth) {
    if (depth > 6) {
      out += "null";
      return;
    }
    if (s.is_boolean() || (s.is_object() && s.empty())) {
      any_value(out, depth);
      return;
    }
    if (s.contains("enum") || s.contains("const")) {
      const ojson v = s.contains("const") ? s["const"] : s["enum"][r_.below(s["enum"].size())];
      out += coin(20) ? v.dump(1) : v.dump();
      return;
    }
    if (s.contains("$ref")) return value(resolve(s["$ref"].get<std::string>()), out, depth);
    if (s.contains("anyOf")) return value(s["anyOf"][r_.below(s["anyOf"].size())], out, depth);
    std::string t;
    if (s.contains("type")) {
      t = s["type"].is_array() ? s["type"][r_.below(s["type"].size())].get<std::string>() : s["type"].get<std::string>();
    }
    if (t.empty()) return any_value(out, depth);
    if (t == "string") {
      string_value(out, s.value("minLength", uint64_t{0}), s.value("maxLength", uint64_t{6}));
    } else if (t == "integer" || t == "number") {
      number_value(out, t == "integer");
    } else if (t == "boolean") {
      out += coin(2) ? "true" : "false";
    } else if (t == "null") {
      out += "null";
    } else if (t == "array") {
      const uint64_t lo = s.value("minItems", uint64_t{0}), hi = s.value("maxItems", uint64_t{3});
      uint64_t n = lo + r_.below(std::min<uint64_t>(hi, lo + 3) - lo + 1);
      if (coin(15)) n += 1;
      out += '[';
      for (uint64_t i = 0; i < n; ++i) {
        if (i > 0) out += "," + space();
        value(s.contains("items") ? s["items"] : ojson(true), out, depth + 1);
      }
      out += ']';
    } else if (t == "object") {
      std::vector<std::pair<std::string, ojson>> members;
      const ojson additional = s.contains("additionalProperties") ? s["additionalProperties"] : ojson(true);
      if (s.contains("properties")) {
        for (const auto& [name, sub] : s["properties"].items()) {
          bool req = false;
          if (s.contains("required")) {
            for (const ojson& x : s["required"]) req = req || x == name;
          }
          if (req || coin(2)) members.emplace_back(name, sub);
        }
      }
      if (s.contains("required")) {
        for (const ojson& x : s["required"]) {
          if (!s.contains("properties") || !s["properties"].contains(x.get<std::string>())) {
            members.emplace_back(x.get<std::string>(), additional);
          }
        }
      }
      if (coin(4)) {
        const size_t at = r_.below(members.size() + 1);
        static const char* extra[] = {"zz", "a", "q\"t", "\x01"};
        members.insert(members.begin() + static_cast<long>(at), {extra[r_.below(4)], additional});
      }
      if (members.size() > 1 && coin(8)) std::swap(members[0], members[1]);
      out += '{';
      for (size_t i = 0; i < members.size(); ++i) {
        if (i > 0) out += "," + space();
        std::string key = json(members[i].first).dump();
        if (coin(30) && key.size() > 2) key = "\"\\u" + std::string("0061") + key.substr(1);  // another spelling
        out += key + (coin(30) ? " :" : ":") + space();
        value(members[i].second, out, depth + 1);
      }
      out += '}';
    }
  }

  void mutate(std::string& s) {
    static const std::string alphabet = "{}[]\",: 0123456789-.eEtrufalsn\\u\nxé";
    const size_t at = s.empty() ? 0 : r_.below(s.size());
    switch (r_.below(3)) {
      case 0:
        if (!s.empty()) s.erase(at, 1);
        break;
      case 1: s.insert(at, 1, alphabet[r_.below(alphabet.size())]); break;
      default:
        if (!s.empty()) s[at] = alphabet[r_.below(alphabet.size())];
        break;
    }
  }

  const ojson& root_;
  Rng r_;
};

// A document drawn from the matcher itself: bytes picked at random among those allowed (closing
// bytes favoured), stopping at random once complete. "" when it ran past max_bytes.
std::string walk_document(const Grammar& g, Rng& r, size_t max_bytes) {
  Matcher m(g);
  std::string out;
  while (out.size() < max_bytes) {
    if (m.accepts_end() && r.below(3) == 0) return out;
    const std::bitset<256> a = m.allowed_bytes();
    if (a.none()) return m.accepts_end() ? out : std::string("STUCK");
    std::vector<int> choices;
    for (int c = 0; c < 256; ++c) {
      if (!a[static_cast<size_t>(c)]) continue;
      const int weight = (c == '"' || c == '}' || c == ']') ? 40 : (c == ',' || c < 0x80) ? 3 : 1;
      for (int w = 0; w < weight; ++w) choices.push_back(c);
    }
    const char c = static_cast<char>(choices[r.below(choices.size())]);
    EXPECT_TRUE(m.advance(std::string_view(&c, 1)));
    out += c;
  }
  return m.accepts_end() ? out : "";
}

TEST(JsonSchemaDifferential, MatcherAcceptsExactlyWhatTheValidatorAccepts) {
  int schemas = 0, accepted = 0, refused = 0, walked = 0;
  for (uint64_t seed = 1; schemas < 300; ++seed) {
    SchemaGen sg(seed);
    const ojson schema = sg.schema();
    std::optional<Grammar> g;
    try {
      g = Grammar::json_schema(schema);
    } catch (const SchemaError&) {
      continue;  // e.g. an object requiring "extra" with additionalProperties false
    }
    ++schemas;
    Validator v(schema);
    DocGen dg(schema, seed * 7919);
    for (int i = 0; i < 60; ++i) {
      const std::string d = dg.doc();
      const bool want = v.accepts(d);
      ASSERT_EQ(accepts(*g, d), want) << "schema " << schema.dump() << "\ndocument " << d;
      if (!want) {
        ++refused;
        continue;
      }
      ++accepted;
      json parsed;
      ASSERT_NO_THROW(parsed = json::parse(d)) << d;
      EXPECT_TRUE(v.sem(parsed, schema)) << "schema " << schema.dump() << "\ndocument " << d;
    }
    Rng r(seed);
    for (int i = 0; i < 10; ++i) {
      const std::string d = walk_document(*g, r, 300);
      ASSERT_NE(d, "STUCK") << schema.dump();
      if (d.empty()) continue;
      ++walked;
      ASSERT_TRUE(v.accepts(d)) << "schema " << schema.dump() << "\nwalked " << d;
      json parsed;
      ASSERT_NO_THROW(parsed = json::parse(d)) << d;
      EXPECT_TRUE(v.sem(parsed, schema)) << "schema " << schema.dump() << "\nwalked " << d;
    }
  }
  // Both answers are common, so the comparison means something.
  EXPECT_GT(accepted, 3000);
  EXPECT_GT(refused, 3000);
  EXPECT_GT(walked, 1500);
  std::printf("differential: %d schemas, %d documents accepted, %d refused, %d drawn from the matcher\n", schemas,
              accepted, refused, walked);
}

// ---------------------------------------------------------------------------------------------
// Token masks against brute force.

// Every single byte (so a walk never starves), JSON fragments, pieces of UTF-8 characters, long
// plain tokens, tokens that are not text ("") and an end-of-sequence id.
std::vector<std::string> toy_vocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"{\"", "\":", "\": ", "\", \"", "\",\"", "\"}", "}", "]}", "red", "\"red\"", "green", "blue", "true",
                        "fal", "se", "null", "nu", "ll", "12", "3.5", "e+1", "-", " ", "  ", "\n", "\\u00", "\\ud83d",
                        "\\ude00", "é", "\xC3", "\xA9", "😀", "\xF0\x9F", "\x98\x80", "abc", "a\"", "\\\"", "\\n", ", ",
                        ",\"", "[", "[]", "{}", "\"\"", ":", "\"color\"", "color", "\"col", "or\":\"", "x", "\x7f", "\t",
                        "abcdef", "ééé", "aaaaaaaaaaaa", "\"gr", "een\"}", "\"}\"", "0", "00", "-0", "1e5", "\\u0041",
                        "\\u001f", "zz\":1}", "\": {\"", "\"v\":", "\"kids\":[", "]", "\"next\":{"}) {
    v.emplace_back(t);
  }
  v.emplace_back("");  // a special token
  v.emplace_back("");  // the end of sequence
  return v;
}

void check_masks_against_brute_force(const Grammar& g, uint64_t seed, int walks) {
  const std::vector<std::string> vocab = toy_vocab();
  const int32_t eos = static_cast<int32_t>(vocab.size() - 1);
  const TokenMasker masker(vocab, {eos});
  Rng r(seed);
  std::vector<uint8_t> mask;
  for (int w = 0; w < walks; ++w) {
    Matcher m(g);
    for (int step = 0; step < 60; ++step) {
      masker.allowed(m, mask);
      ASSERT_EQ(mask.size(), vocab.size());
      std::vector<int32_t> ok;
      for (size_t id = 0; id < vocab.size(); ++id) {
        bool want;
        if (static_cast<int32_t>(id) == eos) {
          want = m.accepts_end();
        } else {
          Matcher c = m.clone();
          want = !vocab[id].empty() && c.advance(vocab[id]);
        }
        ASSERT_EQ(mask[id] != 0, want) << "token " << id << " " << json(vocab[id]).dump(-1, ' ', false, json::error_handler_t::replace);
        if (want) ok.push_back(static_cast<int32_t>(id));
      }
      ASSERT_FALSE(ok.empty()) << "a state with no way on";
      const int32_t pick = ok[r.below(ok.size())];
      ASSERT_TRUE(masker.advance(m, pick));
      if (pick == eos) break;
    }
  }
}

TEST(JsonSchemaMask, EqualsBruteForceOnAToyVocabulary) {
  const char* schemas[] = {
      kColor,
      R"({"type":"object","properties":{"v":{"type":"integer","minimum":-20,"maximum":300},"kids":{"type":"array","items":{"type":"number"},"maxItems":3}},"required":["v"]})",
      R"({"type":"string","maxLength":4})",
      R"({"type":"array","items":{"type":"string","minLength":1,"maxLength":7}})",
      R"({"anyOf":[{"type":"string"},{"type":"integer"},{"enum":["red",[1,2],null]}]})",
      R"({"type":"object","properties":{"next":{"$ref":"#"},"s":{"type":"string"}},"additionalProperties":false})",
      "true",
  };
  uint64_t seed = 1;
  for (const char* s : schemas) {
    SCOPED_TRACE(s);
    check_masks_against_brute_force(compile(s), seed++, 12);
  }
  SCOPED_TRACE("json_object");
  check_masks_against_brute_force(Grammar::json_object(), 99, 12);
}

TEST(JsonSchemaMask, TokensThatAreNotTextAndEndOfSequence) {
  const TokenMasker masker({"{", "}", "", "x", "{}"}, {4});
  EXPECT_EQ(masker.vocab_size(), 5);
  EXPECT_TRUE(masker.is_eos(4));
  EXPECT_FALSE(masker.is_eos(0));
  Matcher m(Grammar::json_object());
  std::vector<uint8_t> mask;
  masker.allowed(m, mask);
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 0, 0, 0, 0}));  // "{}" is the end-of-sequence id here
  EXPECT_FALSE(masker.advance(m, 4));
  EXPECT_FALSE(masker.advance(m, 2));
  EXPECT_FALSE(masker.advance(m, 7));
  EXPECT_FALSE(masker.advance(m, -1));
  ASSERT_TRUE(masker.advance(m, 0));
  ASSERT_TRUE(masker.advance(m, 1));
  masker.allowed(m, mask);
  EXPECT_EQ(mask, (std::vector<uint8_t>{0, 0, 0, 0, 1}));
  ASSERT_TRUE(masker.advance(m, 4));
  masker.allowed(m, mask);
  EXPECT_EQ(mask, (std::vector<uint8_t>(5, 0)));
  EXPECT_THROW(TokenMasker({"a"}, {3}), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// A random-weight model with real vocabularies: tokens drawn uniformly from the mask.

std::string published_dir(const std::string& name) {
  const char* env = std::getenv("DIFFATTN_TOKENIZER_DATA");
  return std::string(env && *env ? env : DIFFATTN_TOKENIZER_DATA_DEFAULT) + "/" + name;
}

bool exists(const std::string& path);

// The tokenizer directory to read. GPT-2's published tokenizer.json lists the merge
// "\u0120Cla ude" whose result is not in its vocab, which diffattn refuses as the tokenizers
// library does (tests/cpp/test_tokenizers.cpp); its copy without that merge (which can never
// apply, so no encoding changes) is written once into a temporary directory.
std::string tokenizer_dir(const std::string& name) {
  const std::string dir = published_dir(name);
  if (name != "gpt2" || !exists(dir + "/tokenizer.json")) return dir;
  static diffattn::testing::TempDir copy("diffattn_gpt2");
  static const std::string fixed = [&] {
    std::ifstream in(dir + "/tokenizer.json");
    json j = json::parse(in);
    json& merges = j["model"]["merges"];
    for (size_t i = 0; i < merges.size(); ++i) {
      if (merges[i] == "\u0120Cla ude") {
        merges.erase(i);
        break;
      }
    }
    std::ofstream(copy / "tokenizer.json") << j.dump();
    std::ifstream cfg(dir + "/tokenizer_config.json");
    std::ofstream(copy / "tokenizer_config.json") << cfg.rdbuf();
    return copy.str();
  }();
  return fixed;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

struct RealVocab {
  std::vector<std::string> bytes;
  std::vector<int32_t> eos;
};

// The bytes of every id through data::Tokenizer::token_bytes, the end of sequence from
// tokenizer_config.json (GPT-2's file names none: its <|endoftext|>).
RealVocab real_vocab(const std::string& name) {
  const std::string dir = tokenizer_dir(name);
  const auto tok = data::load_hf_tokenizer(dir);
  RealVocab v;
  for (int32_t id = 0; id < tok->vocab_size(); ++id) v.bytes.push_back(tok->token_bytes(id));
  if (tok->eos_id() >= 0) v.eos.push_back(tok->eos_id());
  const int32_t eot = data::HfTokenizer::load(dir).id_of("<|endoftext|>");
  if (eot >= 0) v.eos.push_back(eot);
  return v;
}

class RealVocabTest : public ::testing::TestWithParam<const char*> {};

TEST_P(RealVocabTest, RandomSamplerFinishesSmallSchemasQuickly) {
  const std::string name = GetParam();
  if (!exists(tokenizer_dir(name) + "/tokenizer.json")) {
    GTEST_SKIP() << "no tokenizer at " << tokenizer_dir(name) << " (set DIFFATTN_TOKENIZER_DATA)";
  }
  const RealVocab v = real_vocab(name);
  ASSERT_FALSE(v.eos.empty());
  const TokenMasker masker(v.bytes, v.eos);
  const ojson nested = ojson::parse(R"({"type":"object","properties":{
      "id":{"type":"integer","minimum":0,"maximum":999},
      "ok":{"type":"boolean"},
      "note":{"type":"null"},
      "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3},
      "point":{"type":"object","properties":{"x":{"type":"integer","minimum":-9,"maximum":9},"y":{"type":"number"}},"required":["x","y"],"additionalProperties":false},
      "name":{"type":"string","maxLength":8}},
    "required":["id","ok","note","tags","point","name"],"additionalProperties":false})");
  struct Run {
    ojson schema;
    int seeds;
    int max_tokens;
  };
  // The longest nested document: 183 bytes of structure and names, 8 characters of name (at
  // most 4 bytes each), 19 + 16 + 2 digits of y, each token at least one byte.
  const Run runs[] = {{ojson::parse(kColor), 300, 40}, {nested, 100, 260}};
  for (const Run& run : runs) {
    const Grammar g = Grammar::json_schema(run.schema);
    Validator val(run.schema);
    int longest = 0, total = 0;
    for (int seed = 1; seed <= run.seeds; ++seed) {
      Rng r(static_cast<uint64_t>(seed));
      Matcher m(g);
      std::vector<uint8_t> mask;
      std::vector<int32_t> ok;
      std::string text;
      int tokens = 0;
      bool finished = false;
      while (tokens < run.max_tokens && !finished) {
        masker.allowed(m, mask);
        ok.clear();
        for (size_t id = 0; id < mask.size(); ++id) {
          if (mask[id]) ok.push_back(static_cast<int32_t>(id));
        }
        ASSERT_FALSE(ok.empty()) << name << ": no token allowed after " << text;
        const int32_t pick = ok[r.below(ok.size())];
        ++tokens;
        ASSERT_TRUE(masker.advance(m, pick));
        if (masker.is_eos(pick)) finished = true;
        else text += v.bytes[static_cast<size_t>(pick)];
      }
      ASSERT_TRUE(finished) << name << " seed " << seed << ": not finished in " << run.max_tokens << " tokens: " << text;
      longest = std::max(longest, tokens);
      total += tokens;
      json parsed;
      ASSERT_NO_THROW(parsed = json::parse(text)) << text;
      EXPECT_TRUE(val.sem(parsed, run.schema)) << text;
      EXPECT_TRUE(val.accepts(text)) << text;
    }
    std::printf("%s: %d runs, %.1f tokens on average, %d at most (end of sequence included)\n", name.c_str(), run.seeds,
                static_cast<double>(total) / run.seeds, longest);
  }
}

// A schema whose strings have no bound: the sampler never gets stuck (every mask has a token);
// where the server's max_tokens would cut it, the text is a prefix that the mask can still
// close (here: end of sequence, else a closing token, else any allowed one), into a valid
// document.
TEST_P(RealVocabTest, UnboundedStringsNeverStarveTheSampler) {
  const std::string name = GetParam();
  if (!exists(tokenizer_dir(name) + "/tokenizer.json")) {
    GTEST_SKIP() << "no tokenizer at " << tokenizer_dir(name) << " (set DIFFATTN_TOKENIZER_DATA)";
  }
  const RealVocab v = real_vocab(name);
  const TokenMasker masker(v.bytes, v.eos);
  const char* schema = R"({"type":"object","properties":{"text":{"type":"string"},"n":{"type":"number"}},"required":["text"],"additionalProperties":false})";
  const Grammar g = compile(schema);
  Validator val(ojson::parse(schema));
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Rng r(seed);
    Matcher m(g);
    std::vector<uint8_t> mask;
    std::string text;
    bool finished = false;
    for (int tokens = 0; tokens < 240 && !finished; ++tokens) {
      masker.allowed(m, mask);
      std::vector<int32_t> ok;
      for (size_t id = 0; id < mask.size(); ++id) {
        if (mask[id]) ok.push_back(static_cast<int32_t>(id));
      }
      ASSERT_FALSE(ok.empty()) << text;
      int32_t pick = ok[r.below(ok.size())];
      if (tokens >= 200) {  // closing: the end, else a token that closes, else the first allowed
        std::optional<int32_t> best;
        int best_rank = 99;
        for (int32_t id : ok) {
          const std::string& b = v.bytes[static_cast<size_t>(id)];
          const int rank = masker.is_eos(id) ? 0 : b == "\"}" ? 1 : b == "}" ? 2 : b == "\"" ? 3 : 99;
          if (rank < best_rank) best_rank = rank, best = id;
        }
        if (best) pick = *best;
      }
      ASSERT_TRUE(masker.advance(m, pick));
      if (masker.is_eos(pick)) finished = true;
      else text += v.bytes[static_cast<size_t>(pick)];
    }
    ASSERT_TRUE(finished) << text;
    EXPECT_TRUE(val.accepts(text)) << text;
    EXPECT_TRUE(val.sem(json::parse(text), ojson::parse(schema))) << text;
  }
}

// The shortcuts of the mask (the table of plain tokens inside strings, the walk of the other
// tokens' trie) give exactly what trying every token does, in typical states.
TEST_P(RealVocabTest, MaskEqualsBruteForce) {
  const std::string name = GetParam();
  if (!exists(tokenizer_dir(name) + "/tokenizer.json")) {
    GTEST_SKIP() << "no tokenizer at " << tokenizer_dir(name) << " (set DIFFATTN_TOKENIZER_DATA)";
  }
  const RealVocab v = real_vocab(name);
  const TokenMasker masker(v.bytes, v.eos);
  const Grammar any = Grammar::json_object();
  const Grammar nested = compile(R"({"type":"object","properties":{"id":{"type":"integer","minimum":0,"maximum":999},"name":{"type":"string","maxLength":3}},"required":["id","name"]})");
  const std::pair<const Grammar*, const char*> states[] = {
      {&any, ""}, {&any, "{\""}, {&any, "{\"a\": "}, {&any, "{\"a\": \"hello"}, {&any, "{\"a\": \"x\\"},
      {&any, "{\"a\": \"\xE6\x97"}, {&any, "{\"a\": 12"}, {&any, "{\"a\": [1, {\"b\": null}]"}, {&any, "{\"a\":{}}"},
      {&nested, "{\"id\":4"}, {&nested, "{\"id\":4,\"name\":\"a"}, {&nested, "{\"id\":4,\"name\":\"abc"},
      {&nested, "{\"id\":4,\"name\":\"\", \"x"},
  };
  std::vector<uint8_t> mask;
  for (const auto& [g, prefix] : states) {
    Matcher m(*g);
    ASSERT_TRUE(m.advance(prefix)) << prefix;
    masker.allowed(m, mask);
    Matcher c = m;
    int64_t allowed = 0;
    for (size_t id = 0; id < v.bytes.size(); ++id) {
      bool want;
      if (masker.is_eos(static_cast<int32_t>(id))) {
        want = m.accepts_end();
      } else {
        want = !v.bytes[id].empty() && c.advance(v.bytes[id]);
        if (want) c = m;
      }
      ASSERT_EQ(mask[id] != 0, want) << name << " after " << prefix << ": token " << id << " "
                                     << json(v.bytes[id]).dump(-1, ' ', false, json::error_handler_t::replace);
      allowed += want;
    }
    EXPECT_GT(allowed, 0) << prefix;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, RealVocabTest, ::testing::Values("llama3", "gpt2"));

// token_bytes for the three kinds of tokenizer: the concatenated bytes of an encoding are the
// text (byte-level BPE and bytes exactly; SentencePiece up to the space its decoder drops in
// front); special and control tokens are not text.
TEST(JsonSchemaVocab, TokenBytesRebuildTheText) {
  const auto bytes = data::byte_tokenizer();
  EXPECT_EQ(bytes->token_bytes(65), "A");
  EXPECT_EQ(bytes->token_bytes(0), std::string(1, '\0'));
  EXPECT_THROW(bytes->token_bytes(256), InvalidArgument);
  const std::string text = "{\"caf\xC3\xA9\": [1, 2], \"x\": \"\xE6\x97\xA5 \xF0\x9F\x98\x80\"}\n";
  for (const char* name : {"llama3", "gpt2"}) {
    if (!exists(tokenizer_dir(name) + "/tokenizer.json")) continue;
    const auto tok = data::load_hf_tokenizer(tokenizer_dir(name));
    std::string joined;
    for (int32_t id : tok->encode(text)) joined += tok->token_bytes(id);
    EXPECT_EQ(joined, text) << name;  // Llama 3's <|begin_of_text|> adds no bytes
    if (tok->eos_id() >= 0) {
      EXPECT_EQ(tok->token_bytes(tok->eos_id()), "") << name;
    }
    EXPECT_THROW(tok->token_bytes(static_cast<int32_t>(tok->vocab_size())), InvalidArgument);
  }
  diffattn::testing::TempDir d;
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "in the beginning was the word {\"a\": 1} \xC3\xA9t\xC3\xA9\n";
  data::train_sentencepiece(corpus, d / "tokenizer.model", 300, 1);
  const auto sp = data::load_sentencepiece(d / "tokenizer.model");
  const std::string sp_text = "the word {\"a\": 1} \xC3\xA9t\xC3\xA9 \xE2\x82\xAC";  // the euro sign: byte pieces
  std::string joined;
  for (int32_t id : sp->encode(sp_text)) joined += sp->token_bytes(id);
  EXPECT_EQ(joined, " " + sp_text);
  int not_text = 0;
  for (int32_t id = 0; id < sp->vocab_size(); ++id) not_text += sp->token_bytes(id).empty();
  EXPECT_GE(not_text, 3);  // <unk>, <s>, </s>
  EXPECT_EQ(sp->token_bytes(0), "");
}

}  // namespace
