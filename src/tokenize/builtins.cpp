// The chat-template engine's builtins (interp.h): jinja2's filters and tests (filters.py,
// tests.py, with transformers' tojson), the str/dict/list methods the immutable sandbox allows,
// the loop object's attributes and the globals range, namespace, dict, raise_exception,
// strftime_now and joiner. Each follows its Python original, including what it returns for
// Undefined and which results are lazy generators (they print as "<generator object>", have
// no len() and are always true, as in jinja2).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <unordered_set>

#include "tokenize/interp.h"
#include "tokenize/unicode.h"

namespace diffattn::tokenize::jinja {

namespace {

using Opt = std::optional<Value>;

std::string py_quote(const std::string& s) {
  std::string out;
  append_str_repr(out, s);
  return out;
}

Value str_value(std::string s) { return Value(std::move(s)); }

Value iterator(std::vector<Value> items, const char* type = "generator") {
  auto l = std::make_shared<ListData>();
  int d = 0;
  for (const Value& v : items) d = std::max(d, v.depth());
  l->depth = d + 1;
  l->kind = ListKind::kIterator;
  l->type_name = type;
  l->items = std::move(items);
  return Value(ListP(std::move(l)));
}

bool opt_bool(const Opt& o, bool dflt) { return o ? truthy(*o) : dflt; }

int64_t opt_int(const char* fname, const Opt& o, int64_t dflt) {
  if (!o || o->is_none()) return dflt;
  if (!o->is_integral()) type_error(std::string(fname) + ": '" + type_name(*o) + "' object cannot be interpreted as an integer");
  return o->as_int();
}

const std::string& need_str(const char* what, const Value& v) {
  if (!v.is_str()) type_error(std::string(what) + " must be str, not " + type_name(v));
  return v.str();
}

Value require(const char* fname, const Opt& o, const char* name) {
  if (!o) type_error(std::string(fname) + "() missing 1 required positional argument: '" + name + "'");
  return *o;
}

// ---- strings by code point ----

std::vector<size_t> cp_offsets(const std::string& s) {
  std::vector<size_t> offs;
  offs.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    offs.push_back(i);
    unicode::next_cp(s, i);
  }
  offs.push_back(s.size());
  return offs;
}

// Python's ADJUST_INDICES for str.find/count/startswith: byte range [b0, b1) of the code point
// range [start, end); false when start is past the end.
bool cp_range(const StrData& s, const Opt& start, const Opt& end, size_t& b0, size_t& b1, int64_t& cp0) {
  const int64_t len = static_cast<int64_t>(str_len(s));
  int64_t a = start && !start->is_none() ? opt_int("slice", start, 0) : 0;
  int64_t b = end && !end->is_none() ? opt_int("slice", end, len) : len;
  if (b > len) {
    b = len;
  } else if (b < 0) {
    b = std::max<int64_t>(b + len, 0);
  }
  if (a < 0) a = std::max<int64_t>(a + len, 0);
  if (a > len) return false;
  if (b < a) b = a;
  cp0 = a;
  if (s.ascii) {
    b0 = static_cast<size_t>(a);
    b1 = static_cast<size_t>(b);
  } else {
    const auto offs = cp_offsets(s.s);
    b0 = offs[static_cast<size_t>(a)];
    b1 = offs[static_cast<size_t>(b)];
  }
  return true;
}

int64_t byte_to_cp(const StrData& s, size_t byte) {
  return s.ascii ? static_cast<int64_t>(byte) : static_cast<int64_t>(unicode::count_cps(std::string_view(s.s).substr(0, byte)));
}

// Python's str.strip family: chars None strips whitespace, else any of the given characters.
std::string strip(const std::string& s, const Opt& chars, bool left, bool right, const char* fname) {
  std::vector<uint32_t> set;
  const bool ws = !chars || chars->is_none();
  if (!ws) {
    if (!chars->is_str()) type_error(std::string(fname) + " arg must be None or str");
    for (size_t i = 0; i < chars->str().size();) set.push_back(unicode::next_cp(chars->str(), i));
  }
  auto strip_cp = [&](uint32_t c) {
    return ws ? unicode::is_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t a = 0, b = s.size();
  if (left) {
    while (a < b) {
      size_t j = a;
      if (!strip_cp(unicode::next_cp(s, j))) break;
      a = j;
    }
  }
  if (right) {
    while (b > a) {
      size_t k = b - 1;
      while (k > a && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      size_t j = k;
      if (!strip_cp(unicode::next_cp(s, j))) break;
      b = k;
    }
  }
  return s.substr(a, b - a);
}

// str.split / str.rsplit.
Value split(Interp& in, const std::string& s, const Opt& sep_opt, int64_t maxsplit, bool from_right) {
  std::vector<Value> parts;
  if (!sep_opt || sep_opt->is_none()) {
    // Runs of whitespace; leading and trailing whitespace gives no empty parts.
    std::vector<std::pair<size_t, size_t>> words;  // byte ranges
    size_t i = 0;
    while (i < s.size()) {
      size_t j = i;
      if (unicode::is_space(unicode::next_cp(s, j))) {
        i = j;
        continue;
      }
      const size_t start = i;
      size_t end = j;
      i = j;
      while (i < s.size()) {
        size_t k = i;
        if (unicode::is_space(unicode::next_cp(s, k))) break;
        i = k;
        end = k;
      }
      words.emplace_back(start, end);
    }
    const size_t n = words.size();
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= n) {
      for (auto [a, b] : words) parts.push_back(str_value(s.substr(a, b - a)));
    } else if (!from_right) {
      for (size_t k = 0; k < static_cast<size_t>(maxsplit); ++k) parts.push_back(str_value(s.substr(words[k].first, words[k].second - words[k].first)));
      // The rest keeps its inner and trailing whitespace.
      parts.push_back(str_value(s.substr(words[static_cast<size_t>(maxsplit)].first)));
    } else {
      const size_t keep = n - static_cast<size_t>(maxsplit);
      parts.push_back(str_value(s.substr(0, words[keep - 1].second)));
      for (size_t k = keep; k < n; ++k) parts.push_back(str_value(s.substr(words[k].first, words[k].second - words[k].first)));
    }
  } else {
    const std::string& sep = need_str("sep", *sep_opt);
    if (sep.empty()) fail(Kind::kValue, "empty separator");
    std::vector<size_t> at;  // separator positions, in order of splitting
    if (!from_right) {
      for (size_t p = find_sub(s, sep); p != std::string::npos && (maxsplit < 0 || at.size() < static_cast<size_t>(maxsplit));
           p = find_sub(s, sep, p + sep.size())) {
        at.push_back(p);
      }
    } else {
      size_t end = s.size();
      while (maxsplit < 0 || at.size() < static_cast<size_t>(maxsplit)) {
        if (end < sep.size()) break;
        in.step(sep.size() > 64 ? end / 64 : 0);  // a long separator: each search reverses the text
        const size_t p = rfind_sub(s, sep, end - sep.size());
        if (p == std::string::npos) break;
        at.push_back(p);
        end = p;
      }
      std::reverse(at.begin(), at.end());
    }
    size_t prev = 0;
    for (size_t p : at) {
      parts.push_back(str_value(s.substr(prev, p - prev)));
      prev = p + sep.size();
    }
    parts.push_back(str_value(s.substr(prev)));
  }
  in.build_items(parts.size());
  return make_list(std::move(parts));
}

std::vector<std::string> splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    const size_t at = i;
    const uint32_t c = unicode::next_cp(s, i);
    const bool br = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                    c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!br) continue;
    size_t end = i;
    if (c == '\r' && i < s.size() && s[i] == '\n') end = ++i;
    out.push_back(s.substr(start, (keepends ? end : at) - start));
    start = end;
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

std::string replace(Interp& in, const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (count < 0) count = std::numeric_limits<int64_t>::max();
  if (old.empty()) {
    // Python inserts `with` before every character and at the end.
    const size_t cps = unicode::count_cps(s);
    const size_t n = static_cast<size_t>(std::min<int64_t>(count, static_cast<int64_t>(cps) + 1));
    in.build_str(s.size() + n * with.size());
    size_t i = 0, done = 0;
    while (i < s.size()) {
      if (done < n) {
        out += with;
        ++done;
      }
      const size_t start = i;
      unicode::next_cp(s, i);
      out.append(s, start, i - start);
    }
    if (done < n) out += with;
    return out;
  }
  size_t hits = 0;
  for (size_t p = find_sub(s, old); p != std::string::npos && static_cast<int64_t>(hits) < count; p = find_sub(s, old, p + old.size())) ++hits;
  const size_t size = s.size() - hits * old.size() + hits * with.size();
  in.build_str(size);
  out.reserve(size);
  size_t prev = 0, done = 0;
  for (size_t p = find_sub(s, old); p != std::string::npos && done < hits; p = find_sub(s, old, p + old.size()), ++done) {
    out.append(s, prev, p - prev);
    out += with;
    prev = p + old.size();
  }
  out.append(s, prev, std::string::npos);
  return out;
}

std::string pad(Interp& in, const std::string& s, int64_t width, uint32_t fill, char align) {
  const int64_t len = static_cast<int64_t>(unicode::count_cps(s));
  if (width <= len) return s;
  const int64_t marg = width - len;
  int64_t left = 0;
  if (align == '>') {
    left = marg;
  } else if (align == '^') {
    left = marg / 2 + (marg & width & 1);
  }
  std::string f;
  unicode::append_utf8(f, fill);
  in.build_str(s.size() + static_cast<size_t>(marg) * f.size());
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += f;
  out += s;
  for (int64_t i = left; i < marg; ++i) out += f;
  return out;
}

uint32_t fill_char(const Opt& o) {
  if (!o) return ' ';
  const std::string& f = need_str("fill character", *o);
  if (unicode::count_cps(f) != 1) type_error("The fill character must be exactly one character long");
  size_t i = 0;
  return unicode::next_cp(f, i);
}

template <class Pred>
bool all_cps(const std::string& s, Pred p) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    if (!p(unicode::next_cp(s, i))) return false;
  }
  return true;
}

// str.islower (want_upper false) / str.isupper: no character of the other case or titlecase,
// and at least one cased character.
bool has_cased(const std::string& s, bool want_upper) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = unicode::next_cp(s, i);
    const bool lo = unicode::is_lower(c), up = unicode::is_upper(c);
    const bool title = unicode::is_cased(c) && !lo && !up;
    if (title || (want_upper ? lo : up)) return false;
    cased = cased || (want_upper ? up : lo);
  }
  return cased;
}

bool istitle(const std::string& s) {
  bool cased = false, prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = unicode::next_cp(s, i);
    const bool upper_or_title = unicode::is_upper(c) || (unicode::is_cased(c) && !unicode::is_lower(c));
    if (upper_or_title) {
      if (prev_cased) return false;
      prev_cased = cased = true;
    } else if (unicode::is_lower(c)) {
      if (!prev_cased) return false;
      prev_cased = cased = true;
    } else {
      prev_cased = false;
    }
  }
  return cased;
}

// ---- str.format (fields {}, {0}, {name} with !s / !r; no format specs) ----

std::string str_format(Interp& in, const std::string& fmt, Args& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size();) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        i += 2;
        continue;
      }
      fail(Kind::kValue, "Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      i += 2;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail(Kind::kValue, "Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close + 1;
    char conv = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size() || (field[bang + 1] != 's' && field[bang + 1] != 'r')) {
        fail(Kind::kValue, "format: only the conversions !s and !r are supported");
      }
      conv = field[bang + 1];
      field.resize(bang);
    }
    if (field.find_first_of(":.[{") != std::string::npos) {
      fail(Kind::kValue, "format: format specifications and attribute or index fields are not supported");
    }
    Value v;
    if (field.empty()) {
      if (auto_idx >= a.pos.size()) fail(Kind::kValue, "Replacement index " + std::to_string(auto_idx) + " out of range for positional args tuple");
      v = a.pos[auto_idx++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t k = field.size() > 9 ? a.pos.size() : std::stoul(field);
      if (k >= a.pos.size()) fail(Kind::kValue, "Replacement index " + field + " out of range for positional args tuple");
      v = a.pos[k];
    } else {
      bool found = false;
      for (const auto& [name, val] : a.kw) {
        if (name == field) {
          v = val;
          found = true;
        }
      }
      if (!found) fail(Kind::kValue, "KeyError: " + py_quote(field));
    }
    if (conv == 'r') {
      append_repr(out, v);
    } else {
      append_str(out, v);
    }
    in.build_str(out.size());
  }
  return out;
}

// ---- attrgetter, ignore_case (filters.py) ----

std::function<Value(const Value&)> attrgetter(Interp& in, const Value& attribute, const Opt& dflt, bool lower) {
  std::vector<Value> parts;
  if (attribute.is_str()) {
    const std::string& a = attribute.str();
    size_t start = 0;
    while (true) {
      const size_t dot = a.find('.', start);
      std::string p = a.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!p.empty() && p.size() < 18 && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        parts.push_back(Value(static_cast<int64_t>(std::stoll(p))));
      } else {
        parts.push_back(Value(std::move(p)));
      }
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  } else if (!attribute.is_none()) {
    parts.push_back(attribute);
  }
  return [&in, parts, dflt, lower](const Value& item) {
    Value v = item;
    for (const Value& p : parts) {
      v = in.getitem(v, p);
      if (dflt && !dflt->is_none() && v.is_undefined()) v = *dflt;
    }
    if (lower && v.is_str()) v = str_value(unicode::lower(v.str()));
    return v;
  };
}

Value ignore_case(const Value& v) { return v.is_str() ? str_value(unicode::lower(v.str())) : v; }

// ---- filters ----

Value f_abs(Interp&, const Value& v, Args& a) {
  bind_args("abs", a, {});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_integral()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) fail(Kind::kValue, "integer overflow");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  type_error("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("attr", a, {"name"});
  const Value name = require("do_attr", b[0], "name");
  if (v.is_undefined()) v.raise_undefined();
  const std::string n = to_str(name);
  if (auto x = in.attribute(v, n)) return *x;
  return Value::undefined(py_quote(object_type_repr(v)) + " has no attribute " + py_quote(n));
}

Value f_batch(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("batch", a, {"linecount", "fill_with"});
  const int64_t n = opt_int("batch", require("do_batch", b[0], "linecount"), 0);
  std::vector<Value> out, tmp;
  for (const Value& item : iterate(v)) {
    in.step();
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(make_list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (b[1] && !b[1]->is_none()) {
      while (static_cast<int64_t>(tmp.size()) < n) {
        in.build_items(1);
        tmp.push_back(*b[1]);
      }
    }
    out.push_back(make_list(std::move(tmp)));
  }
  return iterator(std::move(out));
}

Value f_capitalize(Interp&, const Value& v, Args& a) {
  bind_args("capitalize", a, {});
  return str_value(unicode::capitalize(to_str(v)));
}

Value f_center(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("center", a, {"width"});
  return str_value(pad(in, to_str(v), opt_int("center", b[0], 80), ' ', '^'));
}

Value f_default(Interp&, const Value& v, Args& a) {
  const auto b = bind_args("default", a, {"default_value", "boolean"});
  const bool boolean = opt_bool(b[1], false);
  if (v.is_undefined() || (boolean && !truthy(v))) return b[0] ? *b[0] : Value(std::string());
  return v;
}

Value f_dictsort(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (v.is_undefined()) v.raise_undefined();
  if (!v.is_dict()) type_error("'" + type_name(v) + "' object has no attribute 'items'");
  const bool cs = opt_bool(b[0], false), rev = opt_bool(b[2], false);
  const std::string by = b[1] ? to_str(*b[1]) : "key";
  if (by != "key" && by != "value") fail(Kind::kValue, "You can only sort by either \"key\" or \"value\"");
  const size_t pos = by == "key" ? 0 : 1;
  std::vector<Value> items;
  for (const auto& [k, x] : v.dict().items) items.push_back(make_list({k, x}, ListKind::kTuple));
  in.step(items.size() * 4);
  auto key = [&](const Value& t) { return cs ? t.list().items[pos] : ignore_case(t.list().items[pos]); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return rev ? order(key(y), key(x)) < 0 : order(key(x), key(y)) < 0;
  });
  return make_list(std::move(items));
}

std::string html_escape(Interp& in, const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  in.build_str(out.size());
  return out;
}

Value f_escape(Interp& in, const Value& v, Args& a) {
  bind_args("escape", a, {});
  return str_value(html_escape(in, to_str(v)));
}

Value f_first(Interp&, const Value& v, Args& a) {
  bind_args("first", a, {});
  if (v.is_str()) {
    if (v.str().empty()) return Value::undefined("No first item, sequence was empty.");
    return str_at(*v.str_p(), 0);
  }
  if (v.is_list()) {
    if (v.list().items.empty()) return Value::undefined("No first item, sequence was empty.");
    return v.list().items.front();
  }
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

// Python's float(str): optional whitespace and sign, digits with single underscores between,
// a fraction, an exponent, or inf/infinity/nan.
std::optional<double> parse_float(const std::string& text) {
  const std::string t = strip(text, std::nullopt, true, true, "strip");
  if (t.empty()) return std::nullopt;
  std::string clean;
  size_t i = 0;
  if (t[0] == '+' || t[0] == '-') clean += t[i++];
  std::string rest = t.substr(i);
  std::string lower = rest;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "inf" || lower == "infinity") return clean == "-" ? -INFINITY : INFINITY;
  if (lower == "nan") return NAN;
  bool digits = false, point = false, exp = false;
  for (size_t k = 0; k < rest.size(); ++k) {
    const char c = rest[k];
    if (c >= '0' && c <= '9') {
      digits = true;
      clean += c;
    } else if (c == '_') {
      if (k == 0 || k + 1 >= rest.size() || !std::isdigit(static_cast<unsigned char>(rest[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(rest[k + 1]))) {
        return std::nullopt;
      }
    } else if (c == '.' && !point && !exp) {
      point = true;
      clean += c;
    } else if ((c == 'e' || c == 'E') && digits && !exp) {
      exp = true;
      clean += c;
      if (k + 1 < rest.size() && (rest[k + 1] == '+' || rest[k + 1] == '-')) clean += rest[++k];
      if (k + 1 >= rest.size()) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return d;
}

// Python's int(str, base) for bases 2..36 and 0.
std::optional<int64_t> parse_int(const std::string& text, int64_t base) {
  std::string t = strip(text, std::nullopt, true, true, "strip");
  bool neg = false;
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  auto has_prefix = [&](char p) {
    return i + 1 < t.size() && t[i] == '0' && (t[i + 1] == p || t[i + 1] == std::toupper(static_cast<unsigned char>(p)));
  };
  if (base == 0) {
    if (has_prefix('x')) {
      base = 16;
      i += 2;
    } else if (has_prefix('o')) {
      base = 8;
      i += 2;
    } else if (has_prefix('b')) {
      base = 2;
      i += 2;
    } else {
      base = 10;
      if (i + 1 < t.size() && t[i] == '0' && t.find_first_not_of("0_", i) != std::string::npos) return std::nullopt;
    }
    if (i < t.size() && t[i] == '_') ++i;
  } else if ((base == 16 && has_prefix('x')) || (base == 8 && has_prefix('o')) || (base == 2 && has_prefix('b'))) {
    i += 2;
    if (i < t.size() && t[i] == '_') ++i;
  }
  if (base < 2 || base > 36) return std::nullopt;
  if (i >= t.size()) return std::nullopt;
  uint64_t v = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_') {
      if (!prev_digit || i + 1 >= t.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (std::isalpha(static_cast<unsigned char>(c))) {
      d = std::tolower(static_cast<unsigned char>(c)) - 'a' + 10;
    } else {
      return std::nullopt;
    }
    if (d >= base) return std::nullopt;
    if (v > (static_cast<uint64_t>(INT64_MAX) + (neg ? 1 : 0) - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) {
      fail(Kind::kValue, "integer overflow (this engine's integers are 64-bit)");
    }
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  return neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}

int64_t float_to_int(double d) {
  if (std::isnan(d)) fail(Kind::kValue, "cannot convert float NaN to integer");
  if (std::isinf(d)) fail(Kind::kValue, "cannot convert float infinity to integer");
  const double t = std::trunc(d);
  if (t >= 9.2233720368547758e18 || t < -9.2233720368547758e18) fail(Kind::kValue, "integer overflow (this engine's integers are 64-bit)");
  return static_cast<int64_t>(t);
}

Value f_float(Interp&, const Value& v, Args& a) {
  const auto b = bind_args("float", a, {"default"});
  const Value dflt = b[0] ? *b[0] : Value(0.0);
  if (v.is_undefined()) v.raise_undefined();
  if (v.is_number()) return Value(v.as_float());
  if (v.is_str()) {
    if (auto d = parse_float(v.str())) return Value(*d);
  }
  return dflt;
}

Value f_int(Interp&, const Value& v, Args& a) {
  const auto b = bind_args("int", a, {"default", "base"});
  const Value dflt = b[0] ? *b[0] : Value(int64_t{0});
  if (v.is_undefined()) v.raise_undefined();
  if (v.is_integral()) return Value(v.as_int());
  if (v.is_float()) return Value(float_to_int(v.as_float()));
  if (v.is_str()) {
    const int64_t base = b[1] ? opt_int("int", b[1], 10) : 10;
    if (auto i = parse_int(v.str(), base)) return Value(*i);
    if (auto d = parse_float(v.str())) return Value(float_to_int(*d));  // "42.23"|int is 42
  }
  return dflt;
}

Value f_format(Interp& in, const Value& v, Args& a) {
  if (!a.pos.empty() && !a.kw.empty()) fail(Kind::kValue, "can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    DictData d;
    for (auto& [k, x] : a.kw) d.set(Value(k), x);
    args = make_dict(std::move(d));
  } else {
    args = make_list(a.pos, ListKind::kTuple);
  }
  const std::string s = percent_format(in, to_str(v), args);
  in.build_str(s.size());
  return str_value(s);
}

Value f_indent(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("indent", a, {"width", "first", "blank"});
  if (v.is_undefined()) v.raise_undefined();
  std::string ind;
  if (b[0] && b[0]->is_str()) {
    ind = b[0]->str();
  } else {
    const int64_t w = opt_int("indent", b[0], 4);
    if (w > static_cast<int64_t>(in.limits().max_output_bytes)) in.build_str(static_cast<size_t>(w));
    ind = std::string(static_cast<size_t>(std::max<int64_t>(w, 0)), ' ');
  }
  const bool first = opt_bool(b[1], false), blank = opt_bool(b[2], false);
  if (!v.is_str()) type_error("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  const std::vector<std::string> lines = splitlines(v.str() + "\n", false);
  in.build_str(v.str().size() + (lines.size() + 1) * (ind.size() + 1));
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? lines[i] : ind + lines[i]);
  }
  if (first) rv = ind + rv;
  return str_value(std::move(rv));
}

Value f_items(Interp& in, const Value& v, Args& a) {
  bind_args("items", a, {});
  if (v.is_undefined()) return iterator({});
  if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict().items) out.push_back(make_list({k, x}, ListKind::kTuple));
  in.step(out.size());
  return iterator(std::move(out));
}

Value f_join(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("join", a, {"d", "attribute"});
  const std::string sep = b[0] ? to_str(*b[0]) : "";
  std::vector<Value> items = iterate(v);
  if (b[1] && !b[1]->is_none()) {
    auto get = attrgetter(in, *b[1], std::nullopt, false);
    for (Value& x : items) x = get(x);
  }
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    in.step();
    if (i) out += sep;
    append_str(out, items[i]);
    in.build_str(out.size());
  }
  return str_value(std::move(out));
}

Value f_last(Interp&, const Value& v, Args& a) {
  bind_args("last", a, {});
  if (v.is_list() && v.list().kind == ListKind::kIterator) type_error("'" + v.list().type_name + "' object is not reversible");
  if (v.is_str()) {
    const size_t n = str_len(*v.str_p());
    if (n == 0) return Value::undefined("No last item, sequence was empty.");
    return str_at(*v.str_p(), static_cast<int64_t>(n) - 1);
  }
  if (!v.is_list() && !v.is_dict() && !v.is_undefined()) type_error("'" + type_name(v) + "' object is not reversible");
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_length(Interp&, const Value& v, Args& a) {
  bind_args("length", a, {});
  return Value(length(v));
}

Value f_list(Interp& in, const Value& v, Args& a) {
  bind_args("list", a, {});
  std::vector<Value> items = iterate(v);
  in.build_items(items.size());
  return make_list(std::move(items));
}

Value f_lower(Interp&, const Value& v, Args& a) {
  bind_args("lower", a, {});
  return str_value(unicode::lower(to_str(v)));
}

Value f_upper(Interp&, const Value& v, Args& a) {
  bind_args("upper", a, {});
  return str_value(unicode::upper(to_str(v)));
}

Value f_map(Interp& in, const Value& v, Args& a) {
  if (!truthy(v)) return iterator({});
  std::function<Value(const Value&)> fn;
  const bool by_attr = a.pos.empty() && std::any_of(a.kw.begin(), a.kw.end(), [](const auto& kv) { return kv.first == "attribute"; });
  if (by_attr) {
    Opt attribute, dflt;
    for (auto& [k, x] : a.kw) {
      if (k == "attribute") {
        attribute = x;
      } else if (k == "default") {
        dflt = x;
      } else {
        fail(Kind::kValue, "Unexpected keyword argument " + py_quote(k));
      }
    }
    fn = attrgetter(in, *attribute, dflt, false);
  } else {
    if (a.pos.empty()) fail(Kind::kValue, "map requires a filter argument");
    const std::string name = to_str(a.pos[0]);
    Args rest{std::vector<Value>(a.pos.begin() + 1, a.pos.end()), a.kw};
    fn = [&in, name, rest](const Value& x) {
      Args c = rest;
      return in.run_filter(name, x, c);
    };
  }
  std::vector<Value> out;
  for (const Value& x : iterate(v)) {
    in.step();
    out.push_back(fn(x));
  }
  return iterator(std::move(out));
}

Value min_max(Interp& in, const Value& v, Args& a, bool want_max) {
  const auto b = bind_args(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = attrgetter(in, b[1] ? *b[1] : Value(), std::nullopt, !opt_bool(b[0], false));
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    in.step();
    Value k = key(items[i]);
    if (compare(k, best_key, want_max ? CmpOp::kGt : CmpOp::kLt)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}
Value f_max(Interp& in, const Value& v, Args& a) { return min_max(in, v, a, true); }
Value f_min(Interp& in, const Value& v, Args& a) { return min_max(in, v, a, false); }

// select / reject / selectattr / rejectattr (filters.py's select_or_reject).
Value select_reject(Interp& in, const Value& v, Args& a, bool keep, bool by_attr) {
  if (!truthy(v)) return iterator({});
  size_t off = 0;
  std::function<Value(const Value&)> trans = [](const Value& x) { return x; };
  if (by_attr) {
    if (a.pos.empty()) fail(Kind::kValue, "Missing parameter for attribute name");
    trans = attrgetter(in, a.pos[0], std::nullopt, false);
    off = 1;
  }
  std::function<bool(const Value&)> pred;
  if (a.pos.size() > off) {
    const std::string name = to_str(a.pos[off]);
    Args rest{std::vector<Value>(a.pos.begin() + static_cast<std::ptrdiff_t>(off) + 1, a.pos.end()), a.kw};
    pred = [&in, name, rest](const Value& x) {
      Args c = rest;
      return in.run_test(name, x, c);
    };
  } else {
    pred = [](const Value& x) { return truthy(x); };
  }
  std::vector<Value> out;
  for (const Value& x : iterate(v)) {
    in.step();
    if (pred(trans(x)) == keep) out.push_back(x);
  }
  return iterator(std::move(out));
}
Value f_select(Interp& in, const Value& v, Args& a) { return select_reject(in, v, a, true, false); }
Value f_reject(Interp& in, const Value& v, Args& a) { return select_reject(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, Args& a) { return select_reject(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, Args& a) { return select_reject(in, v, a, false, true); }

Value f_replace(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("replace", a, {"old", "new", "count"});
  const std::string old = to_str(require("do_replace", b[0], "old"));
  const std::string with = to_str(require("do_replace", b[1], "new"));
  const int64_t count = b[2] && !b[2]->is_none() ? opt_int("replace", b[2], -1) : -1;
  return str_value(replace(in, to_str(v), old, with, count));
}

Value f_reverse(Interp& in, const Value& v, Args& a) {
  bind_args("reverse", a, {});
  if (v.is_str()) {
    const StrData& s = *v.str_p();
    const int64_t n = static_cast<int64_t>(str_len(s));
    return make_str(str_slice_cps(s, n - 1, -1, -1), s.ascii);
  }
  if (v.is_undefined()) return iterator({}, "reversed");
  if (v.is_dict() || v.is_list()) {
    std::vector<Value> items = iterate(v);
    in.step(items.size());
    std::reverse(items.begin(), items.end());
    if (v.is_dict()) return iterator(std::move(items), "dict_reversekeyiterator");
    switch (v.list().kind) {
      case ListKind::kList: return iterator(std::move(items), "list_reverseiterator");
      case ListKind::kTuple: return iterator(std::move(items), "reversed");
      case ListKind::kRange: return iterator(std::move(items), "range_iterator");
      case ListKind::kKeys: return iterator(std::move(items), "dict_reversekeyiterator");
      case ListKind::kValues: return iterator(std::move(items), "dict_reversevalueiterator");
      case ListKind::kItems: return iterator(std::move(items), "dict_reverseitemiterator");
      case ListKind::kIterator: return make_list(std::move(items));
    }
  }
  fail(Kind::kValue, "argument must be iterable");
}

// round(x, n) as Python rounds: correctly rounded, ties to even on the exact binary value
// (printf's rounding), for n >= 0; scaled for n < 0.
double py_round(double x, int64_t n) {
  if (!std::isfinite(x) || n > 320) return x;
  if (n >= 0) {
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  if (n < -320) return std::copysign(0.0, x);
  const double p = std::pow(10.0, static_cast<double>(-n));
  return std::nearbyint(x / p) * p;
}

Value f_round(Interp&, const Value& v, Args& a) {
  const auto b = bind_args("round", a, {"precision", "method"});
  const int64_t prec = opt_int("round", b[0], 0);
  const std::string method = b[1] ? to_str(*b[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") fail(Kind::kValue, "method must be common, ceil or floor");
  if (v.is_undefined() || !v.is_number()) type_error("type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.is_integral()) {
      if (prec >= 0) return Value(v.as_int());
      if (prec < -18) return Value(int64_t{0});
      int64_t p = 1;
      for (int64_t k = 0; k < -prec; ++k) p *= 10;
      const int64_t x = v.as_int();
      int64_t q = x / p, r = x % p;
      if (r < 0) {
        r += p;
        --q;
      }
      if (2 * r > p || (2 * r == p && (q & 1))) ++q;
      return Value(q * p);
    }
    return Value(py_round(v.as_float(), prec));
  }
  const double p = std::pow(10.0, static_cast<double>(prec));
  const double x = v.as_float() * p;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

Value f_safe(Interp&, const Value& v, Args& a) {
  bind_args("safe", a, {});
  return str_value(to_str(v));
}

Value f_sort(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool rev = opt_bool(b[0], false);
  auto key = attrgetter(in, b[2] ? *b[2] : Value(), std::nullopt, !opt_bool(b[1], false));
  std::vector<Value> items = iterate(v);
  in.build_items(items.size());
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (Value& x : items) keyed.emplace_back(key(x), std::move(x));
  const double n = static_cast<double>(keyed.size());
  in.step(static_cast<uint64_t>(n * std::log2(n + 2)));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? order(y.first, x.first) < 0 : order(x.first, y.first) < 0;
  });
  items.clear();
  for (auto& kv : keyed) items.push_back(std::move(kv.second));
  return make_list(std::move(items));
}

Value f_string(Interp&, const Value& v, Args& a) {
  bind_args("string", a, {});
  return str_value(to_str(v));
}

Value f_sum(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("sum", a, {"attribute", "start"});
  Value total = b[1] ? *b[1] : Value(int64_t{0});
  if (total.is_str()) type_error("sum() can't sum strings [use ''.join(seq) instead]");
  std::vector<Value> items = iterate(v);
  if (b[0] && !b[0]->is_none()) {
    auto get = attrgetter(in, *b[0], std::nullopt, false);
    for (Value& x : items) x = get(x);
  }
  for (const Value& x : items) total = in.binary(BinOp::kAdd, total, x);
  return total;
}

Value f_title(Interp&, const Value& v, Args& a) {
  bind_args("title", a, {});
  // jinja2's do_title: split on runs of whitespace and -({[<, then each piece's first character
  // upper-cased and the rest lower-cased.
  const std::string s = to_str(v);
  std::string out;
  size_t i = 0;
  auto sep = [](uint32_t c) { return unicode::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  while (i < s.size()) {
    size_t j = i;
    const bool is_sep = sep(unicode::next_cp(s, j));
    size_t end = j;
    while (end < s.size()) {
      size_t k = end;
      if (sep(unicode::next_cp(s, k)) != is_sep) break;
      end = k;
    }
    out += unicode::upper(std::string_view(s).substr(i, j - i));
    out += unicode::lower(std::string_view(s).substr(j, end - j));
    i = end;
  }
  return str_value(std::move(out));
}

Value f_tojson(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonFormat f;
  f.ensure_ascii = opt_bool(b[0], false);
  if (b[1] && !b[1]->is_none()) {
    if (b[1]->is_str()) {
      f.indent = b[1]->str();
    } else if (b[1]->is_integral()) {
      const int64_t n = b[1]->as_int();
      if (n > 4096) fail(Kind::kLimit, "tojson: an indent of more than 4096 spaces");
      f.indent = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
    } else {
      type_error("can't multiply sequence by non-int of type '" + type_name(*b[1]) + "'");
    }
    f.item_sep = ",";
  }
  if (b[2] && !b[2]->is_none()) {
    const Value& sep = *b[2];
    if (!sep.is_list() || sep.list().items.size() != 2 || !sep.list().items[0].is_str() || !sep.list().items[1].is_str()) {
      type_error("tojson: separators must be a pair of strings (item_separator, key_separator)");
    }
    f.item_sep = sep.list().items[0].str();
    f.key_sep = sep.list().items[1].str();
  }
  f.sort_keys = opt_bool(b[3], false);
  std::string s = to_json(v, f, in.limits().max_output_bytes);
  in.build_str(s.size());
  return str_value(std::move(s));
}

Value f_trim(Interp&, const Value& v, Args& a) {
  const auto b = bind_args("trim", a, {"chars"});
  return str_value(strip(to_str(v), b[0], true, true, "strip"));
}

Value f_unique(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("unique", a, {"case_sensitive", "attribute"});
  auto key = attrgetter(in, b[1] ? *b[1] : Value(), std::nullopt, !opt_bool(b[0], false));
  DictData seen;
  std::vector<Value> out;
  for (const Value& x : iterate(v)) {
    in.step();
    const Value k = key(x);
    if (seen.find(k) == nullptr) {
      seen.set(k, Value());
      out.push_back(x);
    }
  }
  return iterator(std::move(out));
}

Value f_wordcount(Interp&, const Value& v, Args& a) {
  bind_args("wordcount", a, {});
  const std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    const bool w = unicode::is_word(unicode::next_cp(s, i));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"abs", f_abs},         {"attr", f_attr},         {"batch", f_batch},           {"capitalize", f_capitalize},
      {"center", f_center},   {"count", f_length},      {"d", f_default},             {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape},        {"escape", f_escape},         {"first", f_first},
      {"float", f_float},     {"format", f_format},     {"indent", f_indent},         {"int", f_int},
      {"items", f_items},     {"join", f_join},         {"last", f_last},             {"length", f_length},
      {"list", f_list},       {"lower", f_lower},       {"map", f_map},               {"max", f_max},
      {"min", f_min},         {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse}, {"round", f_round},       {"safe", f_safe},             {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort},   {"string", f_string},         {"sum", f_sum},
      {"title", f_title},     {"tojson", f_tojson},     {"trim", f_trim},             {"unique", f_unique},
      {"upper", f_upper},     {"wordcount", f_wordcount},
  };
  return m;
}

// ---- tests ----

bool t_defined(Interp&, const Value& v, Args& a) {
  bind_args("test_defined", a, {});
  return !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, Args& a) {
  bind_args("test_undefined", a, {});
  return v.is_undefined();
}
bool t_none(Interp&, const Value& v, Args& a) {
  bind_args("test_none", a, {});
  return v.is_none();
}
bool t_boolean(Interp&, const Value& v, Args& a) {
  bind_args("test_boolean", a, {});
  return v.is_bool();
}
bool t_true(Interp&, const Value& v, Args& a) {
  bind_args("test_true", a, {});
  return v.is_bool() && v.as_bool();
}
bool t_false(Interp&, const Value& v, Args& a) {
  bind_args("test_false", a, {});
  return v.is_bool() && !v.as_bool();
}
bool t_integer(Interp&, const Value& v, Args& a) {
  bind_args("test_integer", a, {});
  return v.is_int();
}
bool t_float(Interp&, const Value& v, Args& a) {
  bind_args("test_float", a, {});
  return v.is_float();
}
bool t_number(Interp&, const Value& v, Args& a) {
  bind_args("test_number", a, {});
  return v.is_number();
}
bool t_string(Interp&, const Value& v, Args& a) {
  bind_args("test_string", a, {});
  return v.is_str();
}
bool t_mapping(Interp&, const Value& v, Args& a) {
  bind_args("test_mapping", a, {});
  return v.is_dict();
}
bool t_iterable(Interp&, const Value& v, Args& a) {
  bind_args("test_iterable", a, {});
  return v.is_undefined() || v.is_str() || v.is_list() || v.is_dict() || v.is_loop();
}
bool t_sequence(Interp&, const Value& v, Args& a) {
  bind_args("test_sequence", a, {});
  if (v.is_list()) {
    const ListKind k = v.list().kind;
    return k == ListKind::kList || k == ListKind::kTuple || k == ListKind::kRange;
  }
  return v.is_undefined() || v.is_str() || v.is_dict();
}
bool t_callable(Interp&, const Value& v, Args& a) {
  bind_args("test_callable", a, {});
  return v.is_callable() || v.is_undefined() || v.is_loop();
}
bool t_lower(Interp&, const Value& v, Args& a) {
  bind_args("test_lower", a, {});
  return has_cased(to_str(v), false);
}
bool t_upper(Interp&, const Value& v, Args& a) {
  bind_args("test_upper", a, {});
  return has_cased(to_str(v), true);
}
bool mod_is(Interp& in, const Value& v, const Value& m, int64_t want) {
  return equal(in.binary(BinOp::kMod, v, m), Value(want));
}
bool t_odd(Interp& in, const Value& v, Args& a) {
  bind_args("test_odd", a, {});
  return mod_is(in, v, Value(int64_t{2}), 1);
}
bool t_even(Interp& in, const Value& v, Args& a) {
  bind_args("test_even", a, {});
  return mod_is(in, v, Value(int64_t{2}), 0);
}
bool t_divisibleby(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("test_divisibleby", a, {"num"});
  return mod_is(in, v, require("test_divisibleby", b[0], "num"), 0);
}
bool t_in(Interp& in, const Value& v, Args& a) {
  const auto b = bind_args("test_in", a, {"seq"});
  return in.contains(require("test_in", b[0], "seq"), v);
}
bool t_sameas(Interp&, const Value& v, Args& a) {
  const auto b = bind_args("test_sameas", a, {"other"});
  const Value o = require("test_sameas", b[0], "other");
  // Python's `is`: None, True and False are singletons, small ints are cached; everything
  // else is the same object only if it is the same value here.
  if (v.type() != o.type()) return false;
  switch (v.type()) {
    case Value::kNone:
    case Value::kUndefined: return true;
    case Value::kBool: return v.as_bool() == o.as_bool();
    case Value::kInt: return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Value::kFloat: return false;
    default: return v.identity() == o.identity();
  }
}
template <CmpKind K>
bool t_cmp(Interp&, const Value& v, Args& a) {
  const auto b = bind_args("test", a, {"other"});
  const Value o = require("test", b[0], "other");
  switch (K) {
    case CmpKind::kEq: return equal(v, o);
    case CmpKind::kNe: return !equal(v, o);
    case CmpKind::kLt: return compare(v, o, CmpOp::kLt);
    case CmpKind::kLe: return compare(v, o, CmpOp::kLe);
    case CmpKind::kGt: return compare(v, o, CmpOp::kGt);
    default: return compare(v, o, CmpOp::kGe);
  }
}
bool t_filter(Interp&, const Value& v, Args& a) {
  bind_args("test_filter", a, {});
  return v.is_str() && find_filter(v.str()) != nullptr;
}
bool t_test(Interp&, const Value& v, Args& a) {
  bind_args("test_test", a, {});
  return v.is_str() && find_test(v.str()) != nullptr;
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},         {"boolean", t_boolean},
      {"true", t_true},         {"false", t_false},         {"integer", t_integer},   {"float", t_float},
      {"number", t_number},     {"string", t_string},       {"mapping", t_mapping},   {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable},   {"lower", t_lower},       {"upper", t_upper},
      {"odd", t_odd},           {"even", t_even},           {"divisibleby", t_divisibleby}, {"in", t_in},
      {"sameas", t_sameas},     {"eq", t_cmp<CmpKind::kEq>}, {"equalto", t_cmp<CmpKind::kEq>}, {"==", t_cmp<CmpKind::kEq>},
      {"ne", t_cmp<CmpKind::kNe>}, {"!=", t_cmp<CmpKind::kNe>}, {"lt", t_cmp<CmpKind::kLt>}, {"lessthan", t_cmp<CmpKind::kLt>},
      {"<", t_cmp<CmpKind::kLt>}, {"le", t_cmp<CmpKind::kLe>}, {"<=", t_cmp<CmpKind::kLe>}, {"gt", t_cmp<CmpKind::kGt>},
      {"greaterthan", t_cmp<CmpKind::kGt>}, {">", t_cmp<CmpKind::kGt>}, {"ge", t_cmp<CmpKind::kGe>}, {">=", t_cmp<CmpKind::kGe>},
      {"filter", t_filter},     {"test", t_test},
  };
  return m;
}

// ---- methods ----

struct Method : Callable {
  Value self;
  std::string name;
  Value call(Interp& in, Args& args) const override;
  std::string repr() const override { return "<built-in method " + name + " of " + type_name(self) + " object>"; }
};

const std::unordered_set<std::string>& str_methods() {
  static const std::unordered_set<std::string> s = {
      "capitalize", "center", "count", "endswith", "find", "format", "index", "isalnum", "isalpha",
      "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "istitle", "isupper", "join", "ljust",
      "lower", "lstrip", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
      "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title",
      "upper", "zfill"};
  return s;
}

Value str_method(Interp& in, const Value& self, const std::string& m, Args& a) {
  const StrData& sd = *self.str_p();
  const std::string& s = sd.s;
  auto no_args = [&]() { bind_args(m.c_str(), a, {}); };
  if (m == "upper") return no_args(), str_value(unicode::upper(s));
  if (m == "lower") return no_args(), str_value(unicode::lower(s));
  if (m == "title") return no_args(), str_value(unicode::title(s));
  if (m == "capitalize") return no_args(), str_value(unicode::capitalize(s));
  if (m == "swapcase") return no_args(), str_value(unicode::swapcase(s));
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    const auto b = bind_args(m.c_str(), a, {"chars"});
    return str_value(strip(s, b[0], m != "rstrip", m != "lstrip", m.c_str()));
  }
  if (m == "split" || m == "rsplit") {
    const auto b = bind_args(m.c_str(), a, {"sep", "maxsplit"});
    return split(in, s, b[0], opt_int(m.c_str(), b[1], -1), m == "rsplit");
  }
  if (m == "splitlines") {
    const auto b = bind_args(m.c_str(), a, {"keepends"});
    std::vector<Value> out;
    for (std::string& l : splitlines(s, opt_bool(b[0], false))) out.push_back(str_value(std::move(l)));
    in.build_items(out.size());
    return make_list(std::move(out));
  }
  if (m == "startswith" || m == "endswith") {
    const auto b = bind_args(m.c_str(), a, {"prefix", "start", "end"});
    const Value p = require(m.c_str(), b[0], "prefix");
    size_t b0, b1;
    int64_t cp0;
    if (!cp_range(sd, b[1], b[2], b0, b1, cp0)) return Value(false);
    const std::string_view part = std::string_view(s).substr(b0, b1 - b0);
    auto test = [&](const Value& x) {
      if (!x.is_str()) {
        type_error(m + " first arg must be str or a tuple of str, not " + type_name(x));
      }
      const std::string& t = x.str();
      if (t.size() > part.size()) return false;
      return m == "startswith" ? part.compare(0, t.size(), t) == 0 : part.compare(part.size() - t.size(), t.size(), t) == 0;
    };
    if (p.is_list() && p.list().kind == ListKind::kTuple) {
      for (const Value& x : p.list().items) {
        if (test(x)) return Value(true);
      }
      return Value(false);
    }
    if (!p.is_str()) type_error(m + " first arg must be str or a tuple of str, not " + type_name(p));
    return Value(test(p));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
    const auto b = bind_args(m.c_str(), a, {"sub", "start", "end"});
    const std::string& sub = need_str("must be str", require(m.c_str(), b[0], "sub"));
    size_t b0, b1;
    int64_t cp0;
    const bool ok = cp_range(sd, b[1], b[2], b0, b1, cp0);
    const std::string_view part = ok ? std::string_view(s).substr(b0, b1 - b0) : std::string_view();
    if (m == "count") {
      if (!ok) return Value(int64_t{0});
      if (sub.empty()) return Value(static_cast<int64_t>(unicode::count_cps(part)) + 1);
      int64_t n = 0;
      for (size_t p = find_sub(part, sub); p != std::string_view::npos; p = find_sub(part, sub, p + sub.size())) ++n;
      return Value(n);
    }
    size_t p = std::string_view::npos;
    if (ok) p = (m == "find" || m == "index") ? find_sub(part, sub) : rfind_sub(part, sub);
    if (p == std::string_view::npos) {
      if (m == "index" || m == "rindex") fail(Kind::kValue, "substring not found");
      return Value(int64_t{-1});
    }
    return Value(byte_to_cp(sd, b0 + p));
  }
  if (m == "replace") {
    const auto b = bind_args(m.c_str(), a, {"old", "new", "count"});
    const std::string& old = need_str("replace() argument 1", require("replace", b[0], "old"));
    const std::string& with = need_str("replace() argument 2", require("replace", b[1], "new"));
    return str_value(replace(in, s, old, with, opt_int("replace", b[2], -1)));
  }
  if (m == "join") {
    const auto b = bind_args(m.c_str(), a, {"iterable"});
    const std::vector<Value> items = iterate(require("join", b[0], "iterable"));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      in.step();
      if (!items[i].is_str()) {
        type_error("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(items[i]) + " found");
      }
      if (i) out += s;
      out += items[i].str();
      in.build_str(out.size());
    }
    return str_value(std::move(out));
  }
  if (m == "format") {
    std::string out = str_format(in, s, a);
    return str_value(std::move(out));
  }
  if (m == "center" || m == "ljust" || m == "rjust") {
    const auto b = bind_args(m.c_str(), a, {"width", "fillchar"});
    const int64_t w = opt_int(m.c_str(), require(m.c_str(), b[0], "width"), 0);
    return str_value(pad(in, s, w, fill_char(b[1]), m == "center" ? '^' : m == "ljust" ? '<' : '>'));
  }
  if (m == "zfill") {
    const auto b = bind_args(m.c_str(), a, {"width"});
    const int64_t w = opt_int("zfill", require("zfill", b[0], "width"), 0);
    const int64_t len = static_cast<int64_t>(str_len(sd));
    if (w <= len) return self;
    in.build_str(s.size() + static_cast<size_t>(w - len));
    std::string out(static_cast<size_t>(w - len), '0');
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) return str_value(s.substr(0, 1) + out + s.substr(1));
    return str_value(out + s);
  }
  if (m == "partition" || m == "rpartition") {
    const auto b = bind_args(m.c_str(), a, {"sep"});
    const std::string& sep = need_str("must be str", require(m.c_str(), b[0], "sep"));
    if (sep.empty()) fail(Kind::kValue, "empty separator");
    const size_t p = m == "partition" ? find_sub(s, sep) : rfind_sub(s, sep);
    if (p == std::string::npos) {
      return m == "partition" ? make_list({self, str_value(""), str_value("")}, ListKind::kTuple)
                              : make_list({str_value(""), str_value(""), self}, ListKind::kTuple);
    }
    return make_list({str_value(s.substr(0, p)), str_value(sep), str_value(s.substr(p + sep.size()))}, ListKind::kTuple);
  }
  if (m == "removeprefix" || m == "removesuffix") {
    const auto b = bind_args(m.c_str(), a, {"affix"});
    const std::string& x = need_str("must be str", require(m.c_str(), b[0], "affix"));
    if (m == "removeprefix" && s.compare(0, x.size(), x) == 0) return str_value(s.substr(x.size()));
    if (m == "removesuffix" && !x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0) {
      return str_value(s.substr(0, s.size() - x.size()));
    }
    return self;
  }
  no_args();
  if (m == "isalnum") return Value(all_cps(s, unicode::is_alnum));
  if (m == "isalpha") return Value(all_cps(s, unicode::is_alpha));
  if (m == "isdecimal") return Value(all_cps(s, unicode::is_decimal));
  if (m == "isdigit") return Value(all_cps(s, unicode::is_digit));
  if (m == "isnumeric") return Value(all_cps(s, unicode::is_numeric));
  if (m == "isspace") return Value(all_cps(s, unicode::is_space));
  if (m == "islower") return Value(has_cased(s, false));
  if (m == "isupper") return Value(has_cased(s, true));
  if (m == "istitle") return Value(istitle(s));
  fail(Kind::kValue, "unknown str method " + m);
}

Value dict_method(Interp& in, const Value& self, const std::string& m, Args& a) {
  const DictData& d = self.dict();
  if (m == "get") {
    const auto b = bind_args("get", a, {"key", "default"});
    const Value key = require("get", b[0], "key");
    if (const Value* v = d.find(key)) return *v;
    return b[1] ? *b[1] : Value();
  }
  bind_args(m.c_str(), a, {});
  in.step(d.items.size());
  if (m == "copy") return self;
  std::vector<Value> out;
  out.reserve(d.items.size());
  for (const auto& [k, v] : d.items) {
    if (m == "keys") {
      out.push_back(k);
    } else if (m == "values") {
      out.push_back(v);
    } else {
      out.push_back(make_list({k, v}, ListKind::kTuple));
    }
  }
  return make_list(std::move(out), m == "keys" ? ListKind::kKeys : m == "values" ? ListKind::kValues : ListKind::kItems);
}

Value list_method(Interp& in, const Value& self, const std::string& m, Args& a) {
  const auto& items = self.list().items;
  if (m == "copy") {
    bind_args("copy", a, {});
    return make_list(items);
  }
  const auto b = bind_args(m.c_str(), a, {"value"});
  const Value x = require(m.c_str(), b[0], "value");
  int64_t count = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    in.step();
    if (equal(items[i], x)) {
      if (m == "index") return Value(static_cast<int64_t>(i));
      ++count;
    }
  }
  if (m == "index") fail(Kind::kValue, repr(x) + " is not in " + type_name(self));
  return Value(count);
}

Value loop_method(Interp&, const Value& self, const std::string& m, Args& a) {
  LoopData& l = self.loop();
  if (!a.kw.empty()) type_error(m + "() takes no keyword arguments");
  if (m == "cycle") {
    if (a.pos.empty()) type_error("no items for cycling given");
    return a.pos[l.index0 % a.pos.size()];
  }
  const Value now = make_list(a.pos, ListKind::kTuple);
  if (l.last_changed && equal(*l.last_changed, now)) return Value(false);
  l.last_changed = now;
  return Value(true);
}

Value Method::call(Interp& in, Args& args) const {
  switch (self.type()) {
    case Value::kStr: return str_method(in, self, name, args);
    case Value::kDict: return dict_method(in, self, name, args);
    case Value::kList: return list_method(in, self, name, args);
    case Value::kLoop: return loop_method(in, self, name, args);
    default: fail(Kind::kValue, "no method " + name);
  }
}

Value method(const Value& self, const std::string& name) {
  auto m = std::make_shared<Method>();
  m->self = self;
  m->name = name;
  return Value(FnP(std::move(m)));
}

Value unsafe(const Value& self, const std::string& name) {
  return Value::undefined("access to attribute " + py_quote(name) + " of " + py_quote(type_name(self)) + " object is unsafe.",
                          Kind::kSecurity);
}

// ---- globals ----

struct Builtin : Callable {
  const char* name;
  Value (*fn)(Interp&, Args&);
  Builtin(const char* n, Value (*f)(Interp&, Args&)) : name(n), fn(f) {}
  Value call(Interp& in, Args& args) const override { return fn(in, args); }
  std::string repr() const override { return std::string("<function ") + name + ">"; }
};

Value g_range(Interp& in, Args& a) {
  if (!a.kw.empty()) type_error("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) type_error("range expected at most 3 arguments, got " + std::to_string(a.pos.size()));
  for (const Value& v : a.pos) {
    if (!v.is_integral()) type_error("'" + type_name(v) + "' object cannot be interpreted as an integer");
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].as_int();
  } else {
    start = a.pos[0].as_int();
    stop = a.pos[1].as_int();
    if (a.pos.size() == 3) step = a.pos[2].as_int();
  }
  if (step == 0) fail(Kind::kValue, "range() arg 3 must not be zero");
  // The number of elements, without overflow.
  long double n = 0;
  if (step > 0 && start < stop) n = std::floor((static_cast<long double>(stop) - start - 1) / step) + 1;
  if (step < 0 && start > stop) n = std::floor((static_cast<long double>(start) - stop - 1) / (-static_cast<long double>(step))) + 1;
  if (n > static_cast<long double>(in.limits().max_range)) {
    fail(Kind::kLimit, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (" + std::to_string(in.limits().max_range) + ").");
  }
  in.build_items(static_cast<size_t>(n));
  auto l = std::make_shared<ListData>();
  l->kind = ListKind::kRange;
  l->start = start;
  l->stop = stop;
  l->step = step;
  for (int64_t k = 0, x = start; k < static_cast<int64_t>(n); ++k, x += step) l->items.push_back(Value(x));
  return Value(ListP(std::move(l)));
}

// dict(*args, **kwargs): at most one positional (a mapping or pairs), then the keywords.
DictData dict_of(Interp& in, Args& a, const char* fname) {
  if (a.pos.size() > 1) type_error(std::string(fname) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  DictData d;
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      d = src.dict();
    } else {
      for (const Value& pair : iterate(src)) {
        const std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) {
          fail(Kind::kValue, "dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        }
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kw) d.set(Value(k), v);
  in.build_items(d.items.size());
  return d;
}

Value g_dict(Interp& in, Args& a) { return make_dict(dict_of(in, a, "dict")); }

Value g_namespace(Interp& in, Args& a) {
  DictData d = dict_of(in, a, "namespace");
  for (const auto& [k, v] : d.items) {
    if (k.is_str() && !k.str().empty() && k.str()[0] == '_') {
      fail(Kind::kSecurity, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
                                py_quote(k.str()) + ". Please rename the attribute.");
    }
  }
  NsP ns = in.new_namespace();
  ns->attrs = std::move(d);
  return Value(ns);
}

Value g_raise_exception(Interp&, Args& a) {
  const auto b = bind_args("raise_exception", a, {"message"});
  fail(Kind::kRaised, to_str(require("raise_exception", b[0], "message")));
}

int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

Value g_strftime_now(Interp& in, Args& a) {
  const auto b = bind_args("strftime_now", a, {"format"});
  const std::string& fmt = need_str("strftime() argument 1", require("strftime_now", b[0], "format"));
  std::tm tm{};
  int usec = 0;
  if (const auto& now = in.now()) {
    const DateTime& t = *now;
    static const int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (t.year < 1 || t.year > 9999 || t.month < 1 || t.month > 12 || t.day < 1 || t.day > kDays[t.month - 1] ||
        t.hour < 0 || t.hour > 23 || t.minute < 0 || t.minute > 59 || t.second < 0 || t.second > 59 ||
        t.microsecond < 0 || t.microsecond > 999999) {
      fail(Kind::kValue, "strftime_now: the fixed time is not a valid date and time");
    }
    tm.tm_year = t.year - 1900;
    tm.tm_mon = t.month - 1;
    tm.tm_mday = t.day;
    tm.tm_hour = t.hour;
    tm.tm_min = t.minute;
    tm.tm_sec = t.second;
    const int64_t days = days_from_civil(t.year, t.month, t.day);
    tm.tm_wday = static_cast<int>(((days % 7) + 11) % 7);  // 1970-01-01 was a Thursday
    tm.tm_yday = static_cast<int>(days - days_from_civil(t.year, 1, 1));
    tm.tm_isdst = -1;
    usec = t.microsecond;
  } else {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    usec = static_cast<int>(ts.tv_nsec / 1000);
  }
  // Python's datetime.strftime: %f, %z and %Z itself (a naive time has no zone), the rest by
  // the C library, directive by directive.
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t j = i + 1;
    while (j < fmt.size() && std::strchr("_-0^#", fmt[j]) != nullptr) ++j;
    while (j < fmt.size() && j - i < 8 && fmt[j] >= '0' && fmt[j] <= '9') ++j;
    if (j < fmt.size() && (fmt[j] == 'E' || fmt[j] == 'O')) ++j;
    if (j >= fmt.size()) {
      out += fmt.substr(i);
      break;
    }
    const char c = fmt[j];
    if (j == i + 1 && c == 'f') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "%06d", usec);
      out += buf;
    } else if (j == i + 1 && (c == 'z' || c == 'Z')) {
    } else {
      const std::string d = fmt.substr(i, j - i + 1);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, d.c_str(), &tm);
      out.append(buf, n);
    }
    i = j;
    in.build_str(out.size());
  }
  return str_value(std::move(out));
}

struct Joiner : Callable {
  std::string sep;
  mutable bool used = false;
  Value call(Interp&, Args& a) const override {
    bind_args("joiner", a, {});
    if (!used) {
      used = true;
      return str_value("");
    }
    return str_value(sep);
  }
  std::string repr() const override { return "<jinja2.utils.Joiner object>"; }
};

Value g_joiner(Interp&, Args& a) {
  const auto b = bind_args("joiner", a, {"sep"});
  auto j = std::make_shared<Joiner>();
  j->sep = b[0] ? to_str(*b[0]) : ", ";
  return Value(FnP(std::move(j)));
}

}  // namespace

std::vector<std::optional<Value>> bind_args(const char* fname, Args& a, std::initializer_list<const char*> names) {
  std::vector<std::optional<Value>> out(names.size());
  if (a.pos.size() > names.size()) {
    type_error(std::string(fname) + "() takes " + (names.size() ? "at most " : "no arguments, ") +
               (names.size() ? std::to_string(names.size()) + " arguments" : "") + " (" + std::to_string(a.pos.size()) + " given)");
  }
  for (size_t i = 0; i < a.pos.size(); ++i) out[i] = a.pos[i];
  for (auto& [k, v] : a.kw) {
    size_t j = 0;
    for (const char* n : names) {
      if (k == n) break;
      ++j;
    }
    if (j == names.size()) type_error(std::string(fname) + "() got an unexpected keyword argument " + py_quote(k));
    if (out[j]) type_error(std::string(fname) + "() got multiple values for argument " + py_quote(k));
    out[j] = v;
  }
  return out;
}

std::string percent_format(Interp& in, const std::string& fmt, const Value& args) {
  std::vector<Value> pos;
  const Value* mapping = nullptr;
  if (args.is_list() && args.list().kind == ListKind::kTuple) {
    pos = args.list().items;
  } else if (args.is_dict()) {
    mapping = &args;
    pos.push_back(args);
  } else {
    pos.push_back(args);
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  auto take = [&]() -> Value {
    if (next >= pos.size()) type_error("not enough arguments for format string");
    return pos[next++];
  };
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail(Kind::kValue, "incomplete format");
    Value arg;
    bool have = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail(Kind::kValue, "incomplete format key");
      if (mapping == nullptr) type_error("format requires a mapping");
      const Value* v = mapping->dict().find(Value(fmt.substr(i + 1, close - i - 1)));
      if (v == nullptr) fail(Kind::kValue, "KeyError: " + py_quote(fmt.substr(i + 1, close - i - 1)));
      arg = *v;
      have = used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::strchr("-+ #0", fmt[i]) != nullptr) flags += fmt[i++];
    auto number = [&]() -> int {
      if (i < fmt.size() && fmt[i] == '*') {
        ++i;
        const Value w = take();
        if (!w.is_integral()) type_error("* wants int");
        return static_cast<int>(std::clamp<int64_t>(w.as_int(), -100000, 100000));
      }
      int n = 0;
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') n = std::min(n * 10 + (fmt[i++] - '0'), 100000);
      return n;
    };
    int width = number();
    int prec = -1;
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      prec = number();
    }
    while (i < fmt.size() && std::strchr("hlL", fmt[i]) != nullptr) ++i;
    if (i >= fmt.size()) fail(Kind::kValue, "incomplete format");
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (!have) arg = take();
    in.build_str(out.size() + static_cast<size_t>(std::max(width, 0)) + static_cast<size_t>(std::max(prec, 0)));
    std::string body;
    if (c == 's' || c == 'r' || c == 'a') {
      body = c == 's' ? to_str(arg) : repr(arg);
      if (prec >= 0) {
        size_t k = 0;
        for (int n = 0; n < prec && k < body.size(); ++n) unicode::next_cp(body, k);
        body.resize(k);
      }
    } else if (c == 'c') {
      if (arg.is_str() && unicode::count_cps(arg.str()) == 1) {
        body = arg.str();
      } else if (arg.is_integral() && arg.as_int() >= 0 && arg.as_int() <= 0x10FFFF && (arg.as_int() < 0xD800 || arg.as_int() > 0xDFFF)) {
        unicode::append_utf8(body, static_cast<uint32_t>(arg.as_int()));
      } else {
        type_error("%c requires int or char");
      }
    } else if (std::strchr("diuxXoeEfFgG", c) != nullptr) {
      if (!arg.is_number()) {
        type_error(std::string("%") + c + " format: a real number is required, not " + type_name(arg));
      }
      std::string spec = "%";
      for (char f : flags) {
        if (f != '-' && f != '0') spec += f;
      }
      char buf[512];
      if (std::strchr("diuxXo", c) != nullptr) {
        int64_t v = arg.is_float() ? float_to_int(arg.as_float()) : arg.as_int();
        const bool neg = v < 0;
        const uint64_t mag = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
        const char conv = c == 'i' || c == 'u' ? 'd' : c;
        std::string digits_spec = "%";
        if (flags.find('#') != std::string::npos && conv != 'd') digits_spec += '#';
        if (prec >= 0) digits_spec += "." + std::to_string(prec);
        digits_spec += conv == 'd' ? "llu" : std::string("ll") + conv;
        std::snprintf(buf, sizeof buf, digits_spec.c_str(), static_cast<unsigned long long>(mag));
        if (conv == 'o' && flags.find('#') != std::string::npos) {  // Python writes 0o
          std::string d = buf;
          d = "0o" + d.substr(d[0] == '0' && d.size() > 1 ? 1 : 0);
          std::snprintf(buf, sizeof buf, "%s", d.c_str());
        }
        body = std::string(neg ? "-" : flags.find('+') != std::string::npos ? "+" : flags.find(' ') != std::string::npos ? " " : "") + buf;
      } else {
        spec += "." + std::to_string(prec < 0 ? 6 : std::min(prec, 300)) + c;
        std::snprintf(buf, sizeof buf, spec.c_str(), arg.as_float());
        body = buf;
      }
      if (flags.find('0') != std::string::npos && flags.find('-') == std::string::npos &&
          static_cast<int>(body.size()) < width) {
        size_t at = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
        if (body.size() > at + 1 && body[at] == '0' && (body[at + 1] == 'x' || body[at + 1] == 'X' || body[at + 1] == 'o')) at += 2;
        body.insert(at, static_cast<size_t>(width) - body.size(), '0');
      }
    } else {
      fail(Kind::kValue, std::string("unsupported format character '") + c + "'");
    }
    const int len = static_cast<int>(unicode::count_cps(body));
    if (len < width) {
      if (flags.find('-') != std::string::npos) {
        body.append(static_cast<size_t>(width - len), ' ');
      } else {
        body.insert(0, static_cast<size_t>(width - len), ' ');
      }
    }
    out += body;
  }
  if (mapping == nullptr && next < pos.size()) type_error("not all arguments converted during string formatting");
  (void)used_mapping;
  return out;
}

FilterFn find_filter(const std::string& name) {
  const auto& m = filters();
  const auto it = m.find(name);
  return it == m.end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  const auto& m = tests();
  const auto it = m.find(name);
  return it == m.end() ? nullptr : it->second;
}

bool has_filter(const std::string& name) { return find_filter(name) != nullptr; }
bool has_test(const std::string& name) { return find_test(name) != nullptr; }

std::optional<Value> method_of(const Value& self, const std::string& name) {
  switch (self.type()) {
    case Value::kStr:
      if (str_methods().count(name)) return method(self, name);
      return std::nullopt;
    case Value::kDict:
      if (name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy") return method(self, name);
      if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear") return unsafe(self, name);
      return std::nullopt;
    case Value::kList: {
      const ListKind k = self.list().kind;
      if (k == ListKind::kList || k == ListKind::kTuple) {
        if (name == "index" || name == "count" || (name == "copy" && k == ListKind::kList)) return method(self, name);
        if (k == ListKind::kList && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                                     name == "remove" || name == "reverse" || name == "sort" || name == "clear")) {
          return unsafe(self, name);
        }
      }
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

std::optional<Value> loop_attr(const Value& loop, const std::string& name) {
  const LoopData& l = loop.loop();
  const auto& items = l.items->items;
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t i = static_cast<int64_t>(l.index0);
  if (name == "index") return Value(i + 1);
  if (name == "index0") return Value(i);
  if (name == "revindex") return Value(n - i);
  if (name == "revindex0") return Value(n - i - 1);
  if (name == "first") return Value(i == 0);
  if (name == "last") return Value(i == n - 1);
  if (name == "length") return Value(n);
  if (name == "depth") return Value(int64_t{1});
  if (name == "depth0") return Value(int64_t{0});
  if (name == "previtem") return i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item");
  if (name == "nextitem") return i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item");
  if (name == "cycle" || name == "changed") return method(loop, name);
  return std::nullopt;
}

void install_globals(Scope& g) {
  auto add = [&](const char* name, Value (*fn)(Interp&, Args&)) {
    g.vars[name] = Value(FnP(std::make_shared<Builtin>(name, fn)));
  };
  add("range", g_range);
  add("dict", g_dict);
  add("namespace", g_namespace);
  add("raise_exception", g_raise_exception);
  add("strftime_now", g_strftime_now);
  add("joiner", g_joiner);
}

}  // namespace diffattn::tokenize::jinja
