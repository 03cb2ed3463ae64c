// Compiles a JSON schema into the node graph of program.h: one node per subschema and type,
// $refs as alternation nodes resolved from a work list (so a chain of definitions does not
// recurse), enum/const as literal sets filtered by the schema's other keywords, then the
// analyses the automaton relies on: alternatives flattened (strongly connected components of
// the alternation graph), first bytes, and each node's least nesting depth (Knuth's
// generalisation of Dijkstra to "1 + max of" and "min of" rules), which keeps every parse
// finishable.
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

#include "diffattn/base/json_util.h"
#include "diffattn/grammar/json_schema.h"
#include "grammar/program.h"

namespace diffattn::grammar {

SchemaError::SchemaError(std::string keyword, std::string path, const std::string& message)
    : InvalidArgument(message), keyword_(std::move(keyword)), path_(std::move(path)) {}

namespace detail {

ByteTrie ByteTrie::build(const std::vector<std::string>& strings) {
  // Sorted, so that every node's children arrive in byte order and a node's subtree is one run
  // of the sorted list; built level by level from the runs.
  std::vector<uint32_t> order(strings.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) { return strings[x] < strings[y]; });
  ByteTrie t;
  struct Run {
    uint32_t node, begin, end, depth;  // strings order[begin, end) share their first depth bytes
  };
  t.nodes.emplace_back();
  std::deque<Run> runs{{0, 0, static_cast<uint32_t>(order.size()), 0}};
  while (!runs.empty()) {
    const Run r = runs.front();
    runs.pop_front();
    uint32_t i = r.begin;
    ByteTrie::Node& n = t.nodes[r.node];
    n.first_payload = static_cast<uint32_t>(t.payload.size());
    while (i < r.end && strings[order[i]].size() == r.depth) t.payload.push_back(order[i++]);
    n.n_payload = static_cast<uint32_t>(t.payload.size()) - n.first_payload;
    n.first_edge = static_cast<uint32_t>(t.edge_byte.size());
    while (i < r.end) {
      const uint8_t c = static_cast<uint8_t>(strings[order[i]][r.depth]);
      uint32_t j = i;
      while (j < r.end && static_cast<uint8_t>(strings[order[j]][r.depth]) == c) ++j;
      const uint32_t child = static_cast<uint32_t>(t.nodes.size());
      t.nodes.emplace_back();
      t.edge_byte.push_back(c);
      t.edge_child.push_back(child);
      runs.push_back({child, i, j, r.depth + 1});
      i = j;
    }
    t.nodes[r.node].n_edges = static_cast<uint32_t>(t.edge_byte.size()) - t.nodes[r.node].first_edge;
  }
  return t;
}

namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

std::string pointer_token(const std::string& s) {
  std::string out;
  const size_t n = std::min<size_t>(s.size(), 100);
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  if (n < s.size()) out += "...";
  return out;
}

std::string child_path(const std::string& path, const std::string& token) {
  return path + "/" + pointer_token(token);
}

// A value from the schema for a message: its JSON text, cut to about 40 characters.
std::string brief(const ojson& v) {
  return json_brief(json::parse(v.dump(-1, ' ', false, ojson::error_handler_t::replace)));
}

// A JSON string's canonical text: nlohmann's escaping (short escapes, \u00xx for the other
// control characters, everything else as it is), without the quotes.
std::string canonical_content(const std::string& s, const std::string& keyword, const std::string& path) {
  try {
    const std::string q = json(s).dump();
    return q.substr(1, q.size() - 2);
  } catch (const json::exception&) {
    throw SchemaError(keyword, path, "json_schema: " + path + ": the name is not valid UTF-8");
  }
}

const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"title", "description", "examples", "default", "$comment",
                                          "$schema", "deprecated", "readOnly", "writeOnly"};
  return s;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> s = {
      "type", "enum", "const", "anyOf", "$ref", "properties", "required", "additionalProperties",
      "items", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "minimum",
      "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  return s;
}

const std::vector<std::string>& type_names() {
  static const std::vector<std::string> v = {"object", "array", "string", "integer", "number", "boolean", "null"};
  return v;
}

uint32_t count_code_points(const std::string& s) {
  uint32_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

int nesting(const json& v) {
  int d = 0;
  if (v.is_array() || v.is_object()) {
    for (const auto& e : v) d = std::max(d, nesting(e));
    return d + 1;
  }
  return 0;
}

class Compiler {
 public:
  explicit Compiler(const ojson& root) : root_(root), p_(std::make_shared<Program>()) {}

  std::shared_ptr<Program> schema() {
    p_->root = ref_target("#", "", 0);
    drain();
    finish();
    return p_;
  }

  std::shared_ptr<Program> any_object() {
    const uint32_t o = add(NodeKind::kObject, "");
    p_->objects[p_->nodes[o].index].additional = any();
    p_->root = o;
    finish();
    return p_;
  }

 private:
  // ---- building ----
  uint32_t add(NodeKind kind, const std::string& path) {
    if (p_->nodes.size() >= kMaxSchemaNodes) {
      throw SchemaError("", path, "json_schema: the schema is too large (more than " +
                                      std::to_string(kMaxSchemaNodes) + " compiled parts)");
    }
    Node n;
    n.kind = kind;
    n.path = path;
    switch (kind) {
      case NodeKind::kObject: n.index = static_cast<uint32_t>(p_->objects.size()); p_->objects.emplace_back(); break;
      case NodeKind::kArray: n.index = static_cast<uint32_t>(p_->arrays.size()); p_->arrays.emplace_back(); break;
      case NodeKind::kString: n.index = static_cast<uint32_t>(p_->strings.size()); p_->strings.emplace_back(); break;
      case NodeKind::kNumber: n.index = static_cast<uint32_t>(p_->numbers.size()); p_->numbers.emplace_back(); break;
      case NodeKind::kLiteral: n.index = static_cast<uint32_t>(p_->literals.size()); p_->literals.emplace_back(); break;
      default: break;
    }
    p_->nodes.push_back(std::move(n));
    return static_cast<uint32_t>(p_->nodes.size() - 1);
  }

  // Any JSON value (schema true, {}, absent items, additionalProperties true).
  uint32_t any() {
    if (any_ != kNone) return any_;
    any_ = add(NodeKind::kAlt, "");
    const uint32_t obj = add(NodeKind::kObject, "");
    p_->objects[p_->nodes[obj].index].additional = any_;
    const uint32_t arr = add(NodeKind::kArray, "");
    p_->arrays[p_->nodes[arr].index].items = any_;
    const uint32_t str = add(NodeKind::kString, "");
    const uint32_t num = add(NodeKind::kNumber, "");
    const uint32_t lit = add(NodeKind::kLiteral, "");
    LiteralSpec& l = p_->literals[p_->nodes[lit].index];
    l.candidates = {json(true), json(false), json(nullptr)};
    l.texts = {"true", "false", "null"};
    p_->nodes[any_].children = {obj, arr, str, num, lit};
    return any_;
  }

  uint32_t empty(const std::string& path) { return add(NodeKind::kEmpty, path); }

  // A $ref: an alternation node with one child, the target compiled later from the work list.
  uint32_t ref_target(const std::string& ref, const std::string& path, int) {
    const ojson* target = nullptr;
    std::string key, target_path;
    if (ref == "#") {
      target = &root_;
      key = "#";
    } else {
      std::string container, name;
      for (const char* c : {"#/$defs/", "#/definitions/"}) {
        const std::string prefix = c;
        if (ref.compare(0, prefix.size(), prefix) == 0) {
          container = prefix.substr(2, prefix.size() - 3);
          name = ref.substr(prefix.size());
        }
      }
      if (container.empty() || name.find('/') != std::string::npos) {
        throw UnsupportedSchema("$ref", path, "json_schema: " + path + ": $ref " + brief(ojson(ref)) +
                                                  " is not supported (only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\")");
      }
      name = unescape_token(name, path);
      if (!root_.is_object() || !root_.contains(container) || !root_[container].is_object() ||
          !root_[container].contains(name)) {
        throw SchemaError("$ref", path, "json_schema: " + path + ": $ref " + brief(ojson(ref)) + " names no schema");
      }
      target = &root_[container][name];
      key = container + "/" + name;
      target_path = "/" + container + "/" + pointer_token(name);
    }
    auto it = refs_.find(key);
    if (it != refs_.end()) return it->second;
    const uint32_t alt = add(NodeKind::kAlt, path);
    refs_[key] = alt;
    work_.push_back({alt, target, target_path});
    return alt;
  }

  // A JSON pointer token of a fragment: percent-decoded, then ~1 -> '/', ~0 -> '~'.
  static std::string unescape_token(const std::string& s, const std::string& path) {
    std::string pct;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '%' && i + 2 < s.size()) {
        const auto hex = [](char c) {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          return -1;
        };
        const int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
        if (hi >= 0 && lo >= 0) {
          pct += static_cast<char>(hi * 16 + lo);
          i += 2;
          continue;
        }
      }
      pct += s[i];
    }
    std::string out;
    for (size_t i = 0; i < pct.size(); ++i) {
      if (pct[i] == '~' && i + 1 < pct.size() && (pct[i + 1] == '0' || pct[i + 1] == '1')) {
        out += pct[i + 1] == '0' ? '~' : '/';
        ++i;
      } else if (pct[i] == '~') {
        throw SchemaError("$ref", path, "json_schema: " + path + ": $ref has a '~' that is not ~0 or ~1");
      } else {
        out += pct[i];
      }
    }
    return out;
  }

  void drain() {
    while (!work_.empty()) {
      const Work w = work_.front();
      work_.pop_front();
      const uint32_t child = compile(*w.schema, w.path, 0);
      p_->nodes[w.alt].children = {child};
    }
  }

  static uint32_t size_keyword(const ojson& s, const char* k, const std::string& path, uint32_t dflt) {
    if (!s.contains(k)) return dflt;
    const ojson& v = s[k];
    const std::string at = child_path(path, k);
    double x;
    if (v.is_number_unsigned()) {
      x = static_cast<double>(v.get<uint64_t>());
    } else if (v.is_number_integer()) {
      x = static_cast<double>(v.get<int64_t>());
    } else if (v.is_number_float()) {
      x = v.get<double>();
      if (x != std::floor(x)) x = -1;
    } else {
      x = -1;
    }
    if (!(x >= 0)) {
      throw SchemaError(k, at, "json_schema: " + at + " must be a non-negative integer, got " + brief(v));
    }
    return x >= 4294967294.0 ? UINT32_MAX - 1 : static_cast<uint32_t>(x);
  }

  uint32_t compile(const ojson& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) {
      throw SchemaError("", path, "json_schema: " + path + ": schemas nested deeper than " +
                                      std::to_string(kMaxSchemaDepth) + " levels");
    }
    if (s.is_boolean()) return s.get<bool>() ? any() : empty(path);
    if (!s.is_object()) {
      throw SchemaError("", path, "json_schema: " + (path.empty() ? std::string("the schema") : path) +
                                      " must be an object or a boolean, got " + brief(s));
    }
    std::vector<std::string> validation;  // the validation keywords present
    for (const auto& [k, v] : s.items()) {
      const std::string at = child_path(path, k);
      if (annotations().count(k)) continue;
      if (k == "$id") {
        if (path.empty()) continue;
        throw UnsupportedSchema(k, at, "json_schema: unsupported keyword \"$id\" at " + at +
                                           " (only the root may have one)");
      }
      if (k == "$defs" || k == "definitions") {
        if (!v.is_object()) throw SchemaError(k, at, "json_schema: " + at + " must be an object");
        continue;
      }
      if (!supported().count(k)) {
        throw UnsupportedSchema(k, at, "json_schema: unsupported keyword " + brief(ojson(k)) + " at " + at);
      }
      if (k == "uniqueItems") {
        if (!v.is_boolean()) throw SchemaError(k, at, "json_schema: " + at + " must be a boolean");
        if (v.get<bool>()) {
          throw UnsupportedSchema(k, at, "json_schema: unsupported keyword \"uniqueItems\" at " + at +
                                             " (only false is supported)");
        }
        continue;
      }
      validation.push_back(k);
    }
    const bool has_enum = s.contains("enum") || s.contains("const");
    uint32_t rest;
    if (s.contains("$ref") || s.contains("anyOf")) {
      const char* k = s.contains("$ref") ? "$ref" : "anyOf";
      for (const std::string& other : validation) {
        if (other != k && other != "enum" && other != "const") {
          const std::string at = child_path(path, k);
          throw UnsupportedSchema(k, at, "json_schema: " + at + ": " + k + " beside \"" + other +
                                             "\" is not supported (only enum and const may join it)");
        }
      }
      if (s.contains("$ref")) {
        const std::string at = child_path(path, "$ref");
        if (!s["$ref"].is_string()) throw SchemaError("$ref", at, "json_schema: " + at + " must be a string");
        rest = ref_target(s["$ref"].get<std::string>(), at, depth);
      } else {
        const std::string at = child_path(path, "anyOf");
        const ojson& alts = s["anyOf"];
        if (!alts.is_array() || alts.empty()) {
          throw SchemaError("anyOf", at, "json_schema: " + at + " must be a non-empty list of schemas");
        }
        if (alts.size() > kMaxAlternatives) {
          throw SchemaError("anyOf", at, "json_schema: " + at + " has more than " +
                                             std::to_string(kMaxAlternatives) + " alternatives");
        }
        std::vector<uint32_t> children;
        for (size_t i = 0; i < alts.size(); ++i) {
          children.push_back(compile(alts[i], child_path(at, std::to_string(i)), depth + 1));
        }
        rest = add(NodeKind::kAlt, at);
        p_->nodes[rest].children = std::move(children);
      }
    } else {
      rest = typed(s, path, depth);
    }
    if (!has_enum) return rest;
    return literal(s, path, rest == any_ ? kNone : rest);
  }

  uint32_t literal(const ojson& s, const std::string& path, uint32_t rest) {
    std::vector<json> values;
    const auto to_json = [&](const ojson& v, const std::string& at) {
      try {
        return json::parse(v.dump());
      } catch (const std::exception&) {
        throw SchemaError(at.substr(at.rfind('/') + 1), at, "json_schema: " + at + " holds a string that is not valid UTF-8");
      }
    };
    std::vector<std::string> texts;
    if (s.contains("enum")) {
      const std::string at = child_path(path, "enum");
      if (!s["enum"].is_array()) throw SchemaError("enum", at, "json_schema: " + at + " must be a list");
      for (const ojson& v : s["enum"]) {
        values.push_back(to_json(v, at));
        texts.push_back(v.dump());
      }
    }
    if (s.contains("const")) {
      const std::string at = child_path(path, "const");
      const json c = to_json(s["const"], at);
      if (s.contains("enum")) {
        std::vector<json> keep;
        std::vector<std::string> keep_texts;
        for (size_t i = 0; i < values.size(); ++i) {
          if (values[i] == c) keep.push_back(values[i]), keep_texts.push_back(texts[i]);
        }
        values = std::move(keep);
        texts = std::move(keep_texts);
      } else {
        values = {c};
        texts = {s["const"].dump()};
      }
    }
    for (const std::string& t : texts) literal_bytes_ += t.size();
    if (literal_bytes_ > kMaxLiteralBytes) {
      throw SchemaError(s.contains("enum") ? "enum" : "const", path, "json_schema: enum and const values and property names exceed " +
                                                      std::to_string(kMaxLiteralBytes) + " bytes in all");
    }
    const uint32_t id = add(NodeKind::kLiteral, path);
    LiteralSpec& l = p_->literals[p_->nodes[id].index];
    l.candidates = std::move(values);
    l.texts = std::move(texts);  // filtered in finish()
    l.rest = rest;
    return id;
  }

  // The schema's type-specific keywords: one node per type it allows.
  uint32_t typed(const ojson& s, const std::string& path, int depth) {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const std::string at = child_path(path, "type");
      const ojson& t = s["type"];
      std::vector<ojson> list = t.is_array() ? std::vector<ojson>(t.begin(), t.end()) : std::vector<ojson>{t};
      if (list.empty()) throw SchemaError("type", at, "json_schema: " + at + " must name at least one type");
      for (const ojson& x : list) {
        const auto& names = type_names();
        if (!x.is_string() || std::find(names.begin(), names.end(), x.get<std::string>()) == names.end()) {
          throw SchemaError("type", at, "json_schema: " + at + ": " + brief(x) +
                                            " is not a type (object, array, string, integer, number, boolean, null)");
        }
        if (std::find(types.begin(), types.end(), x.get<std::string>()) == types.end()) types.push_back(x.get<std::string>());
      }
    } else {
      types = type_names();
    }
    const auto has = [&](const char* t) { return std::find(types.begin(), types.end(), t) != types.end(); };
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (s.contains(k) && has("number")) {
        const std::string at = child_path(path, k);
        throw UnsupportedSchema(k, at, "json_schema: " + at + ": " + k +
                                           " is supported for type integer only, not number");
      }
    }
    bool specific = false;
    for (const char* k : {"properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                          "minLength", "maxLength"}) {
      specific = specific || s.contains(k);
    }
    if (!s.contains("type") && !specific) return any();
    std::vector<uint32_t> alts;
    for (const std::string& t : type_names()) {
      if (!has(t.c_str())) continue;
      if (t == "object") alts.push_back(object(s, path, depth));
      if (t == "array") alts.push_back(array(s, path, depth));
      if (t == "string") alts.push_back(string(s, path));
      if (t == "integer" && !has("number")) alts.push_back(number(s, path, true));
      if (t == "number") alts.push_back(number(s, path, false));
      if (t == "boolean" || t == "null") {
        const uint32_t id = add(NodeKind::kLiteral, path);
        LiteralSpec& l = p_->literals[p_->nodes[id].index];
        if (t == "boolean") l.candidates = {json(true), json(false)};
        else l.candidates = {json(nullptr)};
        for (const json& v : l.candidates) l.texts.push_back(v.dump());
        alts.push_back(id);
      }
    }
    if (alts.size() == 1) return alts[0];
    const uint32_t id = add(NodeKind::kAlt, child_path(path, "type"));
    p_->nodes[id].children = std::move(alts);
    return id;
  }

  uint32_t object(const ojson& s, const std::string& path, int depth) {
    std::vector<ObjectSpec::Prop> props;
    std::vector<std::string> names;
    if (s.contains("properties")) {
      const std::string at = child_path(path, "properties");
      if (!s["properties"].is_object()) throw SchemaError("properties", at, "json_schema: " + at + " must be an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        const std::string key = canonical_content(name, "properties", at);
        literal_bytes_ += key.size();
        const uint32_t value = compile(sub, child_path(at, name), depth + 1);
        props.push_back({key, value, false});
        names.push_back(name);
      }
    }
    uint32_t additional = kNone;
    if (s.contains("additionalProperties")) {
      const ojson& a = s["additionalProperties"];
      const std::string at = child_path(path, "additionalProperties");
      if (a.is_boolean()) {
        additional = a.get<bool>() ? any() : kNone;
      } else {
        additional = compile(a, at, depth + 1);
      }
    } else {
      additional = any();
    }
    if (s.contains("required")) {
      const std::string at = child_path(path, "required");
      const ojson& r = s["required"];
      if (!r.is_array()) throw SchemaError("required", at, "json_schema: " + at + " must be a list of names");
      for (const ojson& x : r) {
        if (!x.is_string()) throw SchemaError("required", at, "json_schema: " + at + " must be a list of names, got " + brief(x));
        const std::string name = x.get<std::string>();
        const auto it = std::find(names.begin(), names.end(), name);
        if (it != names.end()) {
          props[static_cast<size_t>(it - names.begin())].required = true;
          continue;
        }
        // Required but not declared: its value follows additionalProperties (none: no document).
        const std::string key = canonical_content(name, "required", at);
        literal_bytes_ += key.size();
        props.push_back({key, additional == kNone ? empty(at) : additional, true});
        names.push_back(name);
      }
    }
    if (literal_bytes_ > kMaxLiteralBytes) {
      throw SchemaError("properties", path, "json_schema: enum and const values and property names exceed " +
                                                std::to_string(kMaxLiteralBytes) + " bytes in all");
    }
    const uint32_t id = add(NodeKind::kObject, path);
    ObjectSpec& o = p_->objects[p_->nodes[id].index];
    o.props = std::move(props);
    o.additional = additional;
    for (size_t i = 0; i < names.size(); ++i) o_names_[id].emplace(names[i], static_cast<uint32_t>(i));
    return id;
  }

  uint32_t array(const ojson& s, const std::string& path, int depth) {
    uint32_t items = kNone;
    if (s.contains("items")) {
      const std::string at = child_path(path, "items");
      if (s["items"].is_array()) {
        throw UnsupportedSchema("items", at, "json_schema: " + at + ": items as a list (tuples) is not supported");
      }
      items = compile(s["items"], at, depth + 1);
    } else {
      items = any();
    }
    const uint32_t lo = size_keyword(s, "minItems", path, 0);
    const uint32_t hi = size_keyword(s, "maxItems", path, UINT32_MAX);
    if (lo > hi) return empty(path);
    const uint32_t id = add(NodeKind::kArray, path);
    ArraySpec& a = p_->arrays[p_->nodes[id].index];
    a.items = items;
    a.min_items = lo;
    a.max_items = hi;
    return id;
  }

  uint32_t string(const ojson& s, const std::string& path) {
    const uint32_t lo = size_keyword(s, "minLength", path, 0);
    const uint32_t hi = size_keyword(s, "maxLength", path, UINT32_MAX);
    if (lo > hi) return empty(path);
    const uint32_t id = add(NodeKind::kString, path);
    StringSpec& st = p_->strings[p_->nodes[id].index];
    st.min_len = lo;
    st.max_len = hi;
    return id;
  }

  uint32_t number(const ojson& s, const std::string& path, bool integer) {
    // Integer bounds in long double (exact for int64 and for every double), clamped to what
    // kMaxIntegerDigits digits can write.
    const long double cap = 9999999999999999999.0L;
    long double lo = -cap, hi = cap;
    bool ranged = false;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      const ojson& v = s[k];
      const std::string at = child_path(path, k);
      if (!v.is_number()) throw SchemaError(k, at, "json_schema: " + at + " must be a number, got " + brief(v));
      if (!integer) continue;  // reported by typed() for numbers; here the type is integer
      ranged = true;
      long double x = v.is_number_unsigned() ? static_cast<long double>(v.get<uint64_t>())
                      : v.is_number_integer() ? static_cast<long double>(v.get<int64_t>())
                                              : static_cast<long double>(v.get<double>());
      const std::string key = k;
      if (key == "minimum") lo = std::max(lo, std::ceil(x));
      if (key == "exclusiveMinimum") lo = std::max(lo, std::floor(x) + 1);
      if (key == "maximum") hi = std::min(hi, std::floor(x));
      if (key == "exclusiveMaximum") hi = std::min(hi, std::ceil(x) - 1);
    }
    lo = std::max(lo, -cap);
    hi = std::min(hi, cap);
    if (lo > hi) return empty(path);
    const uint32_t id = add(NodeKind::kNumber, path);
    NumberSpec& n = p_->numbers[p_->nodes[id].index];
    n.integer = integer;
    n.ranged = ranged;
    n.lo = static_cast<__int128>(lo);  // exact: |lo|, |hi| < 2^64 and long double has 64 bits
    n.hi = static_cast<__int128>(hi);
    return id;
  }

  // ---- the semantic check of enum values against the schema's other keywords ----
  // JSON Schema's meaning of node for value v (not the written form): enum values the rest of
  // their schema rejects are dropped. Cycles through alternations at the same value count as
  // "no" (a cycle does not justify itself); results that did not meet one are memoised.
  bool valid(const json& v, uint32_t node, int depth, bool& cycled) {
    if (++semantic_steps_ > 2000000 || depth > 2 * kMaxSchemaDepth + 8) {
      throw SchemaError("enum", p_->nodes[node].path, "json_schema: checking the enum values against their schema costs too much");
    }
    const auto key = std::make_pair(node, &v);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const Node& n = p_->nodes[node];
    bool ok = false, my_cycle = false;
    switch (n.kind) {
      case NodeKind::kEmpty: ok = false; break;
      case NodeKind::kAlt:
      case NodeKind::kLiteral: {
        if (on_path_.count(key)) {
          cycled = true;
          return false;
        }
        on_path_.insert(key);
        if (n.kind == NodeKind::kAlt) {
          for (uint32_t c : n.children) {
            if (valid(v, c, depth + 1, my_cycle)) {
              ok = true;
              break;
            }
          }
        } else {
          const LiteralSpec& l = p_->literals[n.index];
          ok = std::find(l.candidates.begin(), l.candidates.end(), v) != l.candidates.end() &&
               (l.rest == kNone || valid(v, l.rest, depth + 1, my_cycle));
        }
        on_path_.erase(key);
        break;
      }
      case NodeKind::kObject: {
        if (!v.is_object()) break;
        const ObjectSpec& o = p_->objects[n.index];
        const auto& by_name = o_names_[node];
        ok = true;
        for (auto it = v.begin(); ok && it != v.end(); ++it) {
          const auto f = by_name.find(it.key());
          const uint32_t sub = f != by_name.end() ? o.props[f->second].value : o.additional;
          ok = sub != kNone && valid(it.value(), sub, depth + 1, my_cycle);
        }
        for (const auto& [name, i] : by_name) ok = ok && (!o.props[i].required || v.contains(name));
        break;
      }
      case NodeKind::kArray: {
        if (!v.is_array()) break;
        const ArraySpec& a = p_->arrays[n.index];
        ok = v.size() >= a.min_items && v.size() <= a.max_items;
        for (const json& e : v) ok = ok && valid(e, a.items, depth + 1, my_cycle);
        break;
      }
      case NodeKind::kString: {
        if (!v.is_string()) break;
        const StringSpec& s = p_->strings[n.index];
        const uint32_t len = count_code_points(v.get_ref<const std::string&>());
        ok = len >= s.min_len && len <= s.max_len;
        break;
      }
      case NodeKind::kNumber: {
        const NumberSpec& s = p_->numbers[n.index];
        if (!v.is_number()) break;
        if (!s.integer) {
          ok = true;
          break;
        }
        long double x;
        if (v.is_number_unsigned()) x = static_cast<long double>(v.get<uint64_t>());
        else if (v.is_number_integer()) x = static_cast<long double>(v.get<int64_t>());
        else x = static_cast<long double>(v.get<double>());
        ok = std::isfinite(x) && x == std::floor(x) &&
             (!s.ranged || (x >= static_cast<long double>(s.lo) && x <= static_cast<long double>(s.hi)));
        break;
      }
    }
    if (my_cycle) cycled = true;
    else memo_[key] = ok;
    return ok;
  }

  // ---- the analyses ----
  void finish() {
    // Enum values: keep those the rest of their schema accepts; then their tries.
    for (uint32_t id = 0; id < p_->nodes.size(); ++id) {
      if (p_->nodes[id].kind != NodeKind::kLiteral) continue;
      LiteralSpec& l = p_->literals[p_->nodes[id].index];
      std::vector<std::string> texts;
      for (size_t i = 0; i < l.candidates.size(); ++i) {
        bool cycled = false;
        if (l.rest != kNone && !valid(l.candidates[i], l.rest, 0, cycled)) continue;
        if (std::find(texts.begin(), texts.end(), l.texts[i]) != texts.end()) continue;
        texts.push_back(l.texts[i]);
        l.depth = static_cast<uint8_t>(std::max<int>(l.depth, std::min(nesting(l.candidates[i]), 200)));
      }
      l.texts = std::move(texts);
    }
    memo_.clear();
    for (LiteralSpec& l : p_->literals) l.trie = ByteTrie::build(l.texts);
    for (uint32_t id = 0; id < p_->nodes.size(); ++id) {
      if (p_->nodes[id].kind == NodeKind::kObject) object_tables(p_->objects[p_->nodes[id].index]);
    }
    flatten();
    for (Node& n : p_->nodes) {
      switch (n.kind) {
        case NodeKind::kObject: n.first.set('{'); break;
        case NodeKind::kArray: n.first.set('['); break;
        case NodeKind::kString: n.first.set('"'); break;
        case NodeKind::kNumber:
          n.first.set('-');
          for (int c = '0'; c <= '9'; ++c) n.first.set(static_cast<size_t>(c));
          break;
        case NodeKind::kLiteral: {
          const ByteTrie& t = p_->literals[n.index].trie;
          for (uint32_t e = 0; e < t.nodes[0].n_edges; ++e) n.first.set(t.edge_byte[t.nodes[0].first_edge + e]);
          break;
        }
        default: break;
      }
    }
    depths();
    for (ObjectSpec& o : p_->objects) {
      o.suffix_min_depth.assign(o.props.size() + 1, kNoDepth);
      for (size_t i = o.props.size(); i-- > 0;) {
        o.suffix_min_depth[i] = std::min(o.suffix_min_depth[i + 1], p_->nodes[o.props[i].value].min_depth);
      }
    }
    if (!p_->feasible(p_->root, 0)) {
      throw SchemaError("", "", "json_schema: no JSON document satisfies the schema (within " +
                                    std::to_string(kMaxDocumentDepth) + " levels of nesting)");
    }
  }

  void object_tables(ObjectSpec& o) {
    const uint32_t n = static_cast<uint32_t>(o.props.size());
    o.next_required.assign(n + 1, n);
    for (uint32_t i = n; i-- > 0;) o.next_required[i] = o.props[i].required ? i : o.next_required[i + 1];
    std::vector<std::string> keys;
    for (const auto& pr : o.props) keys.push_back(pr.key);
    o.keys = ByteTrie::build(keys);
    // Property indices below each trie node: children come after parents in the node order
    // (built breadth first), so one backward pass sums them up.
    o.below.assign(o.keys.nodes.size(), {});
    for (uint32_t t = static_cast<uint32_t>(o.keys.nodes.size()); t-- > 0;) {
      const ByteTrie::Node& tn = o.keys.nodes[t];
      std::vector<uint32_t>& b = o.below[t];
      for (uint32_t i = 0; i < tn.n_payload; ++i) b.push_back(o.keys.payload[tn.first_payload + i]);
      for (uint32_t e = 0; e < tn.n_edges; ++e) {
        const auto& cb = o.below[o.keys.edge_child[tn.first_edge + e]];
        b.insert(b.end(), cb.begin(), cb.end());
      }
      std::sort(b.begin(), b.end());
    }
  }

  // Each alternation's concrete leaves: Tarjan's strongly connected components of the graph of
  // alternation nodes (iterative), each component's leaves the union of its members' concrete
  // children and its successors' leaves (components come out successors first).
  void flatten() {
    const uint32_t N = static_cast<uint32_t>(p_->nodes.size());
    std::vector<uint32_t> index(N, kNone), low(N, 0), comp(N, kNone);
    std::vector<uint8_t> on_stack(N, 0);
    std::vector<uint32_t> stack;
    std::vector<std::vector<uint32_t>> comp_leaves;
    uint32_t counter = 0;
    struct Visit { uint32_t node, next_child; };
    for (uint32_t s = 0; s < N; ++s) {
      if (p_->nodes[s].kind != NodeKind::kAlt || index[s] != kNone) continue;
      std::vector<Visit> calls{{s, 0}};
      index[s] = low[s] = counter++;
      stack.push_back(s);
      on_stack[s] = 1;
      while (!calls.empty()) {
        Visit& v = calls.back();
        const Node& n = p_->nodes[v.node];
        if (v.next_child < n.children.size()) {
          const uint32_t c = n.children[v.next_child++];
          if (p_->nodes[c].kind != NodeKind::kAlt) continue;
          if (index[c] == kNone) {
            index[c] = low[c] = counter++;
            stack.push_back(c);
            on_stack[c] = 1;
            calls.push_back({c, 0});
          } else if (on_stack[c]) {
            low[v.node] = std::min(low[v.node], index[c]);
          }
          continue;
        }
        const uint32_t u = v.node;
        calls.pop_back();
        if (!calls.empty()) low[calls.back().node] = std::min(low[calls.back().node], low[u]);
        if (low[u] != index[u]) continue;
        // u roots a component: pop it, and gather its leaves.
        const uint32_t cid = static_cast<uint32_t>(comp_leaves.size());
        std::vector<uint32_t> members;
        for (;;) {
          const uint32_t w = stack.back();
          stack.pop_back();
          on_stack[w] = 0;
          comp[w] = cid;
          members.push_back(w);
          if (w == u) break;
        }
        std::vector<uint32_t> leaves;
        const auto add_leaf = [&](uint32_t x) {
          if (std::find(leaves.begin(), leaves.end(), x) != leaves.end()) return;
          leaves.push_back(x);
          if (leaves.size() > kMaxAlternatives) {
            const std::string& path = p_->nodes[u].path;
            const std::string keyword = path.substr(path.rfind('/') + 1);
            throw SchemaError(keyword, path, "json_schema: " + (path.empty() ? std::string("the schema") : path) +
                                                 " stands for more than " + std::to_string(kMaxAlternatives) +
                                                 " alternatives once anyOf, $ref and type lists are expanded");
          }
        };
        for (uint32_t m : members) {
          for (uint32_t c : p_->nodes[m].children) {
            const NodeKind k = p_->nodes[c].kind;
            if (k == NodeKind::kEmpty) continue;
            if (k != NodeKind::kAlt) {
              add_leaf(c);
            } else if (comp[c] != cid) {
              for (uint32_t x : comp_leaves[comp[c]]) add_leaf(x);
            }
          }
        }
        comp_leaves.push_back(leaves);
        for (uint32_t m : members) p_->nodes[m].leaves = leaves;
      }
    }
  }

  void depths() {
    const uint32_t N = static_cast<uint32_t>(p_->nodes.size());
    const uint32_t D = static_cast<uint32_t>(kMaxDocumentDepth);
    std::vector<std::vector<uint32_t>> parents(N), bucket(D + 1);
    std::vector<uint32_t> waiting(N, 0);
    std::vector<uint8_t> best(N, kNoDepth);
    const auto push = [&](uint32_t node, uint32_t d) {
      if (d <= D && d < best[node]) {
        best[node] = static_cast<uint8_t>(d);
        bucket[d].push_back(node);
      }
    };
    for (uint32_t id = 0; id < N; ++id) {
      const Node& n = p_->nodes[id];
      switch (n.kind) {
        case NodeKind::kAlt:
          for (uint32_t c : n.children) parents[c].push_back(id);
          break;
        case NodeKind::kObject: {
          for (const auto& pr : p_->objects[n.index].props) {
            if (pr.required) parents[pr.value].push_back(id), ++waiting[id];
          }
          if (waiting[id] == 0) push(id, 1);
          break;
        }
        case NodeKind::kArray: {
          const ArraySpec& a = p_->arrays[n.index];
          if (a.min_items > 0) parents[a.items].push_back(id);
          else push(id, 1);
          break;
        }
        case NodeKind::kString:
        case NodeKind::kNumber: push(id, 0); break;
        case NodeKind::kLiteral: {
          const LiteralSpec& l = p_->literals[n.index];
          if (!l.texts.empty()) push(id, l.depth);
          break;
        }
        case NodeKind::kEmpty: break;
      }
    }
    std::vector<uint8_t> done(N, 0);
    for (uint32_t d = 0; d <= D; ++d) {
      for (size_t i = 0; i < bucket[d].size(); ++i) {  // the bucket may grow (alternations)
        const uint32_t id = bucket[d][i];
        if (done[id]) continue;
        done[id] = 1;
        p_->nodes[id].min_depth = static_cast<uint8_t>(d);
        for (uint32_t par : parents[id]) {
          const Node& pn = p_->nodes[par];
          if (pn.kind == NodeKind::kAlt) push(par, d);
          else if (pn.kind == NodeKind::kArray) push(par, d + 1);
          else if (pn.kind == NodeKind::kObject && --waiting[par] == 0) push(par, d + 1);  // d is the max
        }
      }
    }
  }

  struct Work {
    uint32_t alt;
    const ojson* schema;
    std::string path;
  };

  const ojson& root_;
  std::shared_ptr<Program> p_;
  uint32_t any_ = kNone;
  size_t literal_bytes_ = 0;
  std::map<std::string, uint32_t> refs_;
  std::deque<Work> work_;
  std::unordered_map<uint32_t, std::unordered_map<std::string, uint32_t>> o_names_;
  struct PairHash {
    size_t operator()(const std::pair<uint32_t, const json*>& k) const {
      return std::hash<const void*>()(k.second) * 31 + k.first;
    }
  };
  std::unordered_map<std::pair<uint32_t, const json*>, bool, PairHash> memo_;
  std::set<std::pair<uint32_t, const json*>> on_path_;
  uint64_t semantic_steps_ = 0;
};

}  // namespace
}  // namespace detail

Grammar Grammar::json_object() {
  static const nlohmann::ordered_json none;
  return Grammar(detail::Compiler(none).any_object());
}

Grammar Grammar::json_schema(const nlohmann::ordered_json& schema) {
  return Grammar(detail::Compiler(schema).schema());
}

Grammar Grammar::json_schema(const nlohmann::json& schema) {
  // Through text: ordered_json from json keeps json's (name) order.
  std::string text;
  try {
    text = schema.dump();
  } catch (const nlohmann::json::exception&) {
    throw SchemaError("", "", "json_schema: the schema holds a string that is not valid UTF-8");
  }
  return json_schema(nlohmann::ordered_json::parse(text));
}

Grammar Grammar::json_schema_text(std::string_view text) {
  struct TooDeep {};
  const nlohmann::ordered_json::parser_callback_t guard = [](int depth, nlohmann::ordered_json::parse_event_t,
                                                             nlohmann::ordered_json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(text.begin(), text.end(), guard);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw InvalidArgument(std::string("json_schema: the schema is not valid JSON (") + e.what() + ")");
  } catch (const TooDeep&) {
    throw InvalidArgument("json_schema: the schema is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  return json_schema(schema);
}

}  // namespace diffattn::grammar
