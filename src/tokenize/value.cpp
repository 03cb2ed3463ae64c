// Values of the chat-template engine (value.h): Python's printing, equality, ordering, hashing
// and json.dumps, over UTF-8 strings.
#include "tokenize/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenize/unicode.h"

namespace diffattn::tokenize::jinja {

namespace {

bool ascii_only(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

[[noreturn]] void too_deep() {
  fail(Kind::kLimit, "values nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
}

}  // namespace

Value::Value(std::string s) {
  const bool a = ascii_only(s);
  const size_t cps = a ? s.size() : unicode::count_cps(s);
  v_ = std::make_shared<const StrData>(StrData{std::move(s), a, cps});
}

Value Value::undefined(std::string message, Kind kind) {
  return Value(std::make_shared<const UndefData>(UndefData{std::move(message), kind}));
}

int Value::depth() const {
  if (is_list()) return list().depth;
  if (is_dict()) return dict().depth;
  return 0;
}

const void* Value::identity() const {
  switch (type()) {
    case kStr: return str_p().get();
    case kList: return list_p().get();
    case kDict: return dict_p().get();
    case kNamespace: return ns_p().get();
    case kCallable: return &fn();
    case kLoop: return &loop();
    default: return nullptr;
  }
}

void Value::raise_undefined() const { fail(undef().kind, undef().message); }

Value make_str(std::string s, bool ascii) {
  const size_t cps = ascii ? s.size() : unicode::count_cps(s);
  return Value(std::make_shared<const StrData>(StrData{std::move(s), ascii, cps}));
}

Value make_list(std::vector<Value> items, ListKind kind) {
  auto l = std::make_shared<ListData>();
  int d = 0;
  for (const Value& v : items) d = std::max(d, v.depth());
  if (d + 1 > kMaxValueDepth) too_deep();
  l->depth = d + 1;
  l->kind = kind;
  l->items = std::move(items);
  return Value(ListP(std::move(l)));
}

Value make_dict(DictData d) {
  int depth = 0;
  for (const auto& [k, v] : d.items) depth = std::max({depth, k.depth(), v.depth()});
  if (depth + 1 > kMaxValueDepth) too_deep();
  d.depth = depth + 1;
  return Value(DictP(std::make_shared<const DictData>(std::move(d))));
}

std::optional<std::string> hash_key(const Value& v) {
  switch (v.type()) {
    case Value::kNone: return std::string("N");
    case Value::kBool:
    case Value::kInt: return "I" + std::to_string(v.as_int());
    case Value::kFloat: {
      const double d = v.as_float();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
        return "I" + std::to_string(static_cast<int64_t>(d));
      }
      return "F" + float_repr(d);
    }
    case Value::kStr: return "S" + v.str();
    case Value::kList: {
      if (v.list().kind != ListKind::kTuple) return std::nullopt;
      std::string k = "T";
      for (const Value& e : v.list().items) {
        auto ek = hash_key(e);
        if (!ek) return std::nullopt;
        k += std::to_string(ek->size()) + ":" + *ek;
      }
      return k;
    }
    case Value::kDict: return std::nullopt;
    case Value::kUndefined: return std::string("U");
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "P%p", v.identity());
      return std::string(buf);
    }
  }
}

const Value* DictData::find(const Value& key) const {
  const auto k = hash_key(key);
  if (!k) type_error("unhashable type: '" + type_name(key) + "'");
  const auto it = index.find(*k);
  return it == index.end() ? nullptr : &items[it->second].second;
}

void DictData::set(Value key, Value value) {
  auto k = hash_key(key);
  if (!k) type_error("unhashable type: '" + type_name(key) + "'");
  const auto it = index.find(*k);
  if (it != index.end()) {
    items[it->second].second = std::move(value);
  } else {
    index.emplace(std::move(*k), items.size());
    items.emplace_back(std::move(key), std::move(value));
  }
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case Value::kUndefined:
    case Value::kNone: return false;
    case Value::kBool: return v.as_bool();
    case Value::kInt: return v.as_int() != 0;
    case Value::kFloat: return v.as_float() != 0.0;
    case Value::kStr: return !v.str().empty();
    case Value::kList: return v.list().kind == ListKind::kIterator || !v.list().items.empty();
    case Value::kDict: return !v.dict().items.empty();
    default: return true;
  }
}

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Value::kUndefined: return "Undefined";
    case Value::kNone: return "NoneType";
    case Value::kBool: return "bool";
    case Value::kInt: return "int";
    case Value::kFloat: return "float";
    case Value::kStr: return "str";
    case Value::kList:
      switch (v.list().kind) {
        case ListKind::kList: return "list";
        case ListKind::kTuple: return "tuple";
        case ListKind::kRange: return "range";
        case ListKind::kKeys: return "dict_keys";
        case ListKind::kValues: return "dict_values";
        case ListKind::kItems: return "dict_items";
        case ListKind::kIterator: return v.list().type_name;
      }
      return "list";
    case Value::kDict: return "dict";
    case Value::kNamespace: return "Namespace";
    case Value::kCallable: return "function";
    case Value::kLoop: return "LoopContext";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_ns()) return "jinja2.utils.Namespace object";
  if (v.is_loop()) return "jinja2.runtime.LoopContext object";
  return type_name(v) + " object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that round-trip, placed as Python's repr places them: fixed notation
  // for exponents -5 < e < 16, else d.ddde+XX.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + e;
  }
  const int point = exp + 1;  // digits before the decimal point
  std::string out;
  if (point <= 0) {
    out = "0." + std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (static_cast<size_t>(point) >= digits.size()) {
    out = digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
  }
  return sign + out;
}

void append_str_repr(std::string& out, std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  out += q;
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = unicode::next_cp(s, i);
    char buf[16];
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      out += buf;
    } else if (cp < 0x80 || unicode::is_printable(cp)) {
      unicode::append_utf8(out, cp);
    } else {
      if (cp <= 0xFF) {
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      } else if (cp <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      }
      out += buf;
    }
  }
  out += q;
}

namespace {

void append_items(std::string& out, const std::vector<Value>& items, int depth) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, items[i], depth + 1);
  }
}

void append_dict(std::string& out, const DictData& d, int depth) {
  out += '{';
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, d.items[i].first, depth + 1);
    out += ": ";
    append_repr(out, d.items[i].second, depth + 1);
  }
  out += '}';
}

}  // namespace

void append_str(std::string& out, const Value& v, int depth) {
  if (depth > kMaxValueDepth) too_deep();
  switch (v.type()) {
    case Value::kUndefined: return;
    case Value::kNone: out += "None"; return;
    case Value::kBool: out += v.as_bool() ? "True" : "False"; return;
    case Value::kInt: out += std::to_string(v.as_int()); return;
    case Value::kFloat: out += float_repr(v.as_float()); return;
    case Value::kStr: out += v.str(); return;
    case Value::kList: {
      const ListData& l = v.list();
      switch (l.kind) {
        case ListKind::kList:
          out += '[';
          append_items(out, l.items, depth);
          out += ']';
          return;
        case ListKind::kTuple:
          out += '(';
          append_items(out, l.items, depth);
          if (l.items.size() == 1) out += ',';
          out += ')';
          return;
        case ListKind::kRange:
          out += "range(" + std::to_string(l.start) + ", " + std::to_string(l.stop);
          if (l.step != 1) out += ", " + std::to_string(l.step);
          out += ')';
          return;
        case ListKind::kKeys:
        case ListKind::kValues:
        case ListKind::kItems:
          out += type_name(v) + "([";
          append_items(out, l.items, depth);
          out += "])";
          return;
        case ListKind::kIterator: out += "<" + l.type_name + " object>"; return;
      }
      return;
    }
    case Value::kDict: append_dict(out, v.dict(), depth); return;
    case Value::kNamespace:
      out += "<Namespace ";
      append_dict(out, v.ns().attrs, depth);
      out += '>';
      return;
    case Value::kCallable: out += v.fn().repr(); return;
    case Value::kLoop: {
      const LoopData& l = v.loop();
      out += "<LoopContext " + std::to_string(l.index0 + 1) + "/" + std::to_string(l.items->items.size()) + ">";
      return;
    }
  }
}

std::string to_str(const Value& v) {
  if (v.is_str()) return v.str();
  std::string out;
  append_str(out, v);
  return out;
}

void append_repr(std::string& out, const Value& v, int depth) {
  if (v.is_str()) {
    append_str_repr(out, v.str());
  } else if (v.is_undefined()) {
    out += "Undefined";
  } else {
    append_str(out, v, depth);
  }
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

namespace {

// Exact comparison of an int64 with a double (long double holds every int64 on x86-64; elsewhere
// the comparison falls back to double).
int cmp_num(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) {
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  const long double x = a.is_float() ? static_cast<long double>(a.as_float()) : static_cast<long double>(a.as_int());
  const long double y = b.is_float() ? static_cast<long double>(b.as_float()) : static_cast<long double>(b.as_int());
  if (x < y) return -1;
  if (x > y) return 1;
  if (x == y) return 0;
  return 2;  // NaN: unordered
}

bool same_sequence_kind(const Value& a, const Value& b) {
  const ListKind x = a.list().kind, y = b.list().kind;
  return x == y && (x == ListKind::kList || x == ListKind::kTuple || x == ListKind::kRange);
}

const char* op_text(CmpOp op) {
  switch (op) {
    case CmpOp::kLt: return "<";
    case CmpOp::kLe: return "<=";
    case CmpOp::kGt: return ">";
    case CmpOp::kGe: return ">=";
  }
  return "<";
}

}  // namespace

bool equal(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) too_deep();
  if (a.is_number() && b.is_number()) return cmp_num(a, b) == 0;
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::kUndefined:
    case Value::kNone: return true;
    case Value::kStr: return a.str() == b.str();
    case Value::kList: {
      if (a.list_p() == b.list_p()) return true;
      if (!same_sequence_kind(a, b)) {
        if (a.list().kind == ListKind::kKeys && b.list().kind == ListKind::kKeys) {
          // Set-like: the same keys in any order.
          if (a.list().items.size() != b.list().items.size()) return false;
          DictData d;
          for (const Value& k : a.list().items) d.set(k, Value());
          for (const Value& k : b.list().items) {
            if (d.find(k) == nullptr) return false;
          }
          return true;
        }
        return false;
      }
      const auto& x = a.list().items;
      const auto& y = b.list().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equal(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::kDict: {
      const DictData& x = a.dict();
      const DictData& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (w == nullptr || !equal(v, *w, depth + 1)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

int order(const Value& a, const Value& b, int depth) {
  if (compare(a, b, CmpOp::kLt, depth)) return -1;
  if (compare(b, a, CmpOp::kLt, depth)) return 1;
  return 0;
}

bool compare(const Value& a, const Value& b, CmpOp op, int depth) {
  if (depth > kMaxValueDepth) too_deep();
  if (a.is_undefined()) a.raise_undefined();
  if (b.is_undefined()) b.raise_undefined();
  int c;
  if (a.is_number() && b.is_number()) {
    c = cmp_num(a, b);
    if (c == 2) return false;
  } else if (a.is_str() && b.is_str()) {
    const int r = a.str().compare(b.str());  // UTF-8 byte order is code point order
    c = r < 0 ? -1 : r > 0 ? 1 : 0;
  } else if (a.is_list() && b.is_list() && same_sequence_kind(a, b) && a.list().kind != ListKind::kRange) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    size_t i = 0;
    while (i < x.size() && i < y.size() && equal(x[i], y[i], depth + 1)) ++i;
    if (i < x.size() && i < y.size()) return compare(x[i], y[i], op, depth + 1);
    c = x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  } else {
    type_error(std::string("'") + op_text(op) + "' not supported between instances of '" + type_name(a) +
               "' and '" + type_name(b) + "'");
  }
  switch (op) {
    case CmpOp::kLt: return c < 0;
    case CmpOp::kLe: return c <= 0;
    case CmpOp::kGt: return c > 0;
    case CmpOp::kGe: return c >= 0;
  }
  return false;
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    char buf[16];
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
      continue;
    }
    const size_t start = i;
    const uint32_t cp = unicode::next_cp(s, i);
    if (!ensure_ascii) {
      out.append(s.substr(start, i - start));
    } else if (cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      out += buf;
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

[[noreturn]] void not_serializable(const Value& v) {
  std::string t = type_name(v);
  if (v.is_callable()) t = v.fn().repr().rfind("<Macro", 0) == 0 ? "Macro" : "function";
  type_error("Object of type " + t + " is not JSON serializable");
}

struct JsonWriter {
  const JsonFormat& f;
  size_t max_bytes;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += *f.indent;
  }
  void check() {
    if (out.size() > max_bytes) {
      fail(Kind::kLimit, "tojson: the JSON text is longer than " + std::to_string(max_bytes) + " bytes");
    }
  }
  std::string key_text(const Value& k) {
    switch (k.type()) {
      case Value::kStr: return k.str();
      case Value::kBool: return k.as_bool() ? "true" : "false";
      case Value::kNone: return "null";
      case Value::kInt: return std::to_string(k.as_int());
      case Value::kFloat: return json_float(k.as_float());
      default:
        type_error("keys must be str, int, float, bool or None, not " + type_name(k));
    }
  }
  void write(const Value& v, int level) {
    if (level > kMaxValueDepth) too_deep();
    check();
    switch (v.type()) {
      case Value::kNone: out += "null"; return;
      case Value::kBool: out += v.as_bool() ? "true" : "false"; return;
      case Value::kInt: out += std::to_string(v.as_int()); return;
      case Value::kFloat: out += json_float(v.as_float()); return;
      case Value::kStr: json_string(out, v.str(), f.ensure_ascii); return;
      case Value::kList: {
        const ListData& l = v.list();
        if (l.kind != ListKind::kList && l.kind != ListKind::kTuple) not_serializable(v);
        if (l.items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < l.items.size(); ++i) {
          if (i) out += f.item_sep;
          if (f.indent) newline(level + 1);
          write(l.items[i], level + 1);
        }
        if (f.indent) newline(level);
        out += ']';
        return;
      }
      case Value::kDict: {
        const DictData& d = v.dict();
        if (d.items.empty()) {
          out += "{}";
          return;
        }
        std::vector<size_t> idx(d.items.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        if (f.sort_keys) {
          std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
            return order(d.items[a].first, d.items[b].first) < 0;
          });
        }
        out += '{';
        for (size_t n = 0; n < idx.size(); ++n) {
          const auto& [k, val] = d.items[idx[n]];
          if (n) out += f.item_sep;
          if (f.indent) newline(level + 1);
          json_string(out, key_text(k), f.ensure_ascii);
          out += f.key_sep;
          write(val, level + 1);
        }
        if (f.indent) newline(level);
        out += '}';
        return;
      }
      default: not_serializable(v);
    }
  }
};

}  // namespace

std::string to_json(const Value& v, const JsonFormat& f, size_t max_bytes) {
  JsonWriter w{f, max_bytes, {}};
  w.write(v, 0);
  w.check();
  return std::move(w.out);
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) too_deep();
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      if (unicode::invalid_utf8_at(s) != std::string::npos) fail(Kind::kValue, "an input string is not valid UTF-8");
      return Value(s);
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData d;
      d.items.reserve(j.size());
      for (const auto& [k, v] : j.items()) {
        if (unicode::invalid_utf8_at(k) != std::string::npos) fail(Kind::kValue, "an input key is not valid UTF-8");
        d.set(Value(k), from_json(v, depth + 1));
      }
      return make_dict(std::move(d));
    }
    default: fail(Kind::kType, "binary JSON values are not supported");
  }
}

namespace {

size_t kmp_find(std::string_view hay, std::string_view needle, size_t from) {
  const size_t m = needle.size();
  std::vector<size_t> fail(m, 0);  // fail[i]: the longest proper border of needle[0..i]
  for (size_t i = 1, k = 0; i < m; ++i) {
    while (k > 0 && needle[i] != needle[k]) k = fail[k - 1];
    if (needle[i] == needle[k]) ++k;
    fail[i] = k;
  }
  for (size_t i = from, k = 0; i < hay.size(); ++i) {
    while (k > 0 && hay[i] != needle[k]) k = fail[k - 1];
    if (hay[i] == needle[k]) ++k;
    if (k == m) return i + 1 - m;
  }
  return std::string_view::npos;
}

}  // namespace

size_t find_sub(std::string_view hay, std::string_view needle, size_t from) {
  if (needle.size() <= 64 || from > hay.size() || hay.size() - from < needle.size()) return hay.find(needle, from);
  return kmp_find(hay, needle, from);
}

size_t rfind_sub(std::string_view hay, std::string_view needle, size_t pos) {
  if (needle.size() <= 64 || hay.size() < needle.size()) return hay.rfind(needle, pos);
  const size_t end = std::min(hay.size(), pos == std::string_view::npos ? hay.size() : pos + needle.size());
  const std::string rh(hay.rbegin() + static_cast<std::ptrdiff_t>(hay.size() - end), hay.rend());
  const std::string rn(needle.rbegin(), needle.rend());
  const size_t r = kmp_find(rh, rn, 0);
  return r == std::string_view::npos ? r : end - r - needle.size();
}

Value str_at(const StrData& s, int64_t i) {
  if (s.ascii) return make_str(std::string(1, s.s[static_cast<size_t>(i)]), true);
  size_t pos = 0;
  for (int64_t k = 0; k < i; ++k) unicode::next_cp(s.s, pos);
  size_t end = pos;
  unicode::next_cp(s.s, end);
  return make_str(s.s.substr(pos, end - pos), end - pos == 1);
}

std::string str_slice_cps(const StrData& s, int64_t start, int64_t stop, int64_t step) {
  // start/stop/step already adjusted as Python's slice.indices(len) does.
  std::string out;
  if (s.ascii) {
    if (step == 1) return start < stop ? s.s.substr(static_cast<size_t>(start), static_cast<size_t>(stop - start)) : "";
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out += s.s[static_cast<size_t>(i)];
    return out;
  }
  std::vector<size_t> offs;  // byte offset of each code point, and the end
  for (size_t i = 0; i < s.s.size();) {
    offs.push_back(i);
    unicode::next_cp(s.s, i);
  }
  offs.push_back(s.s.size());
  if (step == 1) {
    return start < stop ? s.s.substr(offs[static_cast<size_t>(start)], offs[static_cast<size_t>(stop)] - offs[static_cast<size_t>(start)]) : "";
  }
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    const size_t a = offs[static_cast<size_t>(i)], b = offs[static_cast<size_t>(i) + 1];
    out.append(s.s, a, b - a);
  }
  return out;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.type()) {
    case Value::kUndefined: return {};
    case Value::kStr: {
      const StrData& s = *v.str_p();
      std::vector<Value> out;
      out.reserve(s.s.size());
      for (size_t i = 0; i < s.s.size();) {
        const size_t start = i;
        unicode::next_cp(s.s, i);
        out.push_back(make_str(s.s.substr(start, i - start), i - start == 1));
      }
      return out;
    }
    case Value::kList: return v.list().items;
    case Value::kDict: {
      std::vector<Value> out;
      out.reserve(v.dict().items.size());
      for (const auto& kv : v.dict().items) out.push_back(kv.first);
      return out;
    }
    default: type_error("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.type()) {
    case Value::kUndefined: return 0;
    case Value::kStr: return static_cast<int64_t>(str_len(*v.str_p()));
    case Value::kList:
      if (v.list().kind == ListKind::kIterator) break;
      return static_cast<int64_t>(v.list().items.size());
    case Value::kDict: return static_cast<int64_t>(v.dict().items.size());
    case Value::kLoop: return static_cast<int64_t>(v.loop().items->items.size());
    default: break;
  }
  type_error("object of type '" + type_name(v) + "' has no len()");
}

}  // namespace diffattn::tokenize::jinja
