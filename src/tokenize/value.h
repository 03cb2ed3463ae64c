// Values of the chat-template engine, with Python's semantics as jinja2 sees them: None, bool,
// int (64-bit; overflow is an error where Python would grow), float, str (UTF-8, indexed by code
// point), list and tuple (immutable: the sandbox forbids changing them), dict (insertion order),
// namespace (the one mutable container), callables, the loop object, and jinja2's Undefined.
// str()/repr() print as Python does; tojson writes as Python's json.dumps does.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "diffattn/tokenize/chat_template.h"

namespace diffattn::tokenize::jinja {

using Kind = TemplateError::Kind;

// A failure while parsing or rendering; the interpreter adds the innermost node's position
// and the template's name when it turns this into a TemplateError.
struct RenderError {
  Kind kind;
  std::string message;
  int line = 0, col = 0;
};

[[noreturn]] inline void fail(Kind kind, std::string message) { throw RenderError{kind, std::move(message)}; }
[[noreturn]] inline void type_error(std::string message) { fail(Kind::kType, std::move(message)); }

// Values nest at most this deep (lists in lists...): printing, comparing and freeing them
// recurse, so the depth is bounded where a value is built.
inline constexpr int kMaxValueDepth = 128;

class Value;
struct StrData {
  std::string s;
  bool ascii;   // all bytes below 0x80: code point i is byte i
  size_t cps;   // code points (len() is O(1))
};
enum class ListKind : uint8_t { kList, kTuple, kRange, kKeys, kValues, kItems, kIterator };
struct ListData;
struct DictData;
struct NsData;
struct Callable;
struct LoopData;
struct UndefData {
  std::string message;  // raised when the undefined value is used
  Kind kind = Kind::kUndefined;
};

using StrP = std::shared_ptr<const StrData>;
using ListP = std::shared_ptr<const ListData>;
using DictP = std::shared_ptr<const DictData>;
using NsP = std::shared_ptr<NsData>;
using FnP = std::shared_ptr<const Callable>;
using LoopP = std::shared_ptr<LoopData>;
using UndefP = std::shared_ptr<const UndefData>;
struct None {};

class Value {
 public:
  enum Type { kUndefined, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kNamespace, kCallable, kLoop };

  Value() : v_(None{}) {}
  static Value undefined(std::string message, Kind kind = Kind::kUndefined);
  static Value none() { return Value(); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double f) : v_(f) {}
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(StrP s) : v_(std::move(s)) {}
  Value(ListP l) : v_(std::move(l)) {}
  Value(DictP d) : v_(std::move(d)) {}
  Value(NsP n) : v_(std::move(n)) {}
  Value(FnP f) : v_(std::move(f)) {}
  Value(LoopP l) : v_(std::move(l)) {}
  Value(UndefP u) : v_(std::move(u)) {}

  Type type() const {
    switch (v_.index()) {
      case 0: return kUndefined;
      case 1: return kNone;
      case 2: return kBool;
      case 3: return kInt;
      case 4: return kFloat;
      case 5: return kStr;
      case 6: return kList;
      case 7: return kDict;
      case 8: return kNamespace;
      case 9: return kCallable;
      default: return kLoop;
    }
  }
  bool is_undefined() const { return v_.index() == 0; }
  bool is_none() const { return v_.index() == 1; }
  bool is_bool() const { return v_.index() == 2; }
  bool is_int() const { return v_.index() == 3; }    // not bool
  bool is_float() const { return v_.index() == 4; }
  bool is_str() const { return v_.index() == 5; }
  bool is_list() const { return v_.index() == 6; }   // any ListKind
  bool is_dict() const { return v_.index() == 7; }
  bool is_ns() const { return v_.index() == 8; }
  bool is_callable() const { return v_.index() == 9; }
  bool is_loop() const { return v_.index() == 10; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_integral() const { return is_bool() || is_int(); }  // Python's isinstance(x, int)

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return is_bool() ? (std::get<bool>(v_) ? 1 : 0) : std::get<int64_t>(v_); }
  double as_float() const { return is_float() ? std::get<double>(v_) : static_cast<double>(as_int()); }
  const std::string& str() const { return std::get<StrP>(v_)->s; }
  const StrP& str_p() const { return std::get<StrP>(v_); }
  const ListData& list() const { return *std::get<ListP>(v_); }
  const ListP& list_p() const { return std::get<ListP>(v_); }
  const DictData& dict() const { return *std::get<DictP>(v_); }
  const DictP& dict_p() const { return std::get<DictP>(v_); }
  NsData& ns() const { return *std::get<NsP>(v_); }
  const NsP& ns_p() const { return std::get<NsP>(v_); }
  const Callable& fn() const { return *std::get<FnP>(v_); }
  LoopData& loop() const { return *std::get<LoopP>(v_); }
  const UndefData& undef() const { return *std::get<UndefP>(v_); }

  int depth() const;  // nesting of lists and dicts (0 for a scalar)
  const void* identity() const;  // the object behind a container, string or callable

  // Raises the undefined value's error (for an undefined value only).
  [[noreturn]] void raise_undefined() const;

 private:
  std::variant<UndefP, None, bool, int64_t, double, StrP, ListP, DictP, NsP, FnP, LoopP> v_;
};

struct ListData {
  ListKind kind = ListKind::kList;
  std::vector<Value> items;
  int depth = 1;
  int64_t start = 0, stop = 0, step = 1;  // a range's arguments (kRange)
  std::string type_name;                  // an iterator's Python type (kIterator)
};

// An ordered dict; keys are compared as Python hashes them (1 == 1.0 == True).
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  std::unordered_map<std::string, size_t> index;
  int depth = 1;
  const Value* find(const Value& key) const;  // nullptr when absent; type_error when unhashable
  void set(Value key, Value value);
};

struct NsData {
  DictData attrs;
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Interp;
struct Callable {
  virtual ~Callable() = default;
  virtual Value call(Interp& in, Args& args) const = 0;
  virtual std::string repr() const = 0;
};

struct LoopData {
  ListP items;
  size_t index0 = 0;
  int depth0 = 0;
  std::optional<Value> last_changed;
};

// Python's hash key of a value ("S..." for a str, "I..." for an integral number, ...); nullopt
// for an unhashable one (list, dict).
std::optional<std::string> hash_key(const Value& v);

// Builders that check the depth and size bounds.
Value make_list(std::vector<Value> items, ListKind kind = ListKind::kList);
Value make_dict(DictData d);
Value make_str(std::string s, bool ascii);

// Python's truthiness.
bool truthy(const Value& v);
// Python's type(v).__name__ ("str", "int", "NoneType", "Undefined", ...).
std::string type_name(const Value& v);
// jinja2's object_type_repr: "dict object", "None", ...
std::string object_type_repr(const Value& v);

// str(v) and repr(v) as Python prints them (Undefined prints empty).
std::string to_str(const Value& v);
void append_str(std::string& out, const Value& v, int depth = 0);
std::string repr(const Value& v);
void append_repr(std::string& out, const Value& v, int depth = 0);
void append_str_repr(std::string& out, std::string_view s);
std::string float_repr(double d);

// Python's ==, and <, ..., for sort and the comparison operators.
bool equal(const Value& a, const Value& b, int depth = 0);
enum class CmpOp { kLt, kLe, kGt, kGe };
bool compare(const Value& a, const Value& b, CmpOp op, int depth = 0);
// -1/0/1 by Python's <, for sorting; type_error when the values do not compare.
int order(const Value& a, const Value& b, int depth = 0);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson calls it.
struct JsonFormat {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonFormat& f, size_t max_bytes);

// Values from JSON input (checked: at most kMaxValueDepth deep).
Value from_json(const nlohmann::ordered_json& j, int depth = 0);

// Iterates a value as Python's iter() does (str by character, dict by key, Undefined empty);
// type_error for what is not iterable.
std::vector<Value> iterate(const Value& v);
// len(); type_error when there is none.
int64_t length(const Value& v);

// Code point string helpers.
inline size_t str_len(const StrData& s) { return s.cps; }
std::string str_slice_cps(const StrData& s, int64_t start, int64_t stop, int64_t step);
Value str_at(const StrData& s, int64_t i);  // one character; undefined-free (caller checks range)

// Substring search in O(n + m) (a template may search one long message in another): the
// library's find for needles of at most 64 bytes, Knuth-Morris-Pratt for longer ones.
size_t find_sub(std::string_view hay, std::string_view needle, size_t from = 0);
// The last occurrence starting at or before `pos` (std::string::rfind's meaning).
size_t rfind_sub(std::string_view hay, std::string_view needle, size_t pos = std::string_view::npos);

}  // namespace diffattn::tokenize::jinja
