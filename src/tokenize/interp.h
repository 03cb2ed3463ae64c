// The chat-template interpreter: walks a Program (ast.h) with jinja2's semantics (scopes, loop
// objects, macros, the sandbox's attribute rules, Undefined) and every bound of
// ChatTemplateLimits. interp.cpp holds statements and expressions; builtins.cpp the filters,
// tests, methods of str/dict/list and the globals (range, namespace, dict, raise_exception,
// strftime_now, joiner).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenize/ast.h"

namespace diffattn::tokenize::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};

// A macro, or the `caller` of a {% call %} block; it resolves free names in the scope it was
// defined in (while that scope lives; the template's top scope afterwards).
struct Macro : Callable {
  const Stmt* def = nullptr;
  std::weak_ptr<Scope> scope;
  std::string name;
  Value call(Interp& in, Args& args) const override;
  std::string repr() const override { return "<Macro '" + name + "'>"; }
};

class Interp {
 public:
  Interp(const Program& prog, const RenderOptions& options);
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  // Renders the template with these variables (name -> value), then breaks every reference
  // cycle the rendering made (namespaces that hold themselves).
  std::string render(std::vector<std::pair<std::string, Value>> vars);

  const ChatTemplateLimits& limits() const { return lim_; }
  const std::optional<DateTime>& now() const { return opts_.now; }

  // Budgets: steps (each node, statement, loop turn, element a filter touches) and bytes of
  // strings built; both throw a kLimit error when exhausted.
  void step(uint64_t n = 1) {
    steps_ += n;
    if (steps_ > lim_.max_steps) over_steps();
  }
  // Before building a string of `bytes`: within max_output_bytes, and counted in max_work_bytes.
  void build_str(size_t bytes);
  // Before building a list or dict of n elements.
  void build_items(size_t n);

  // jinja2's sandboxed getattr (obj.name: the attribute, else the item) and getitem (obj[key]:
  // the item, else the attribute); attribute() is the attribute alone (nullopt: none).
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  std::optional<Value> attribute(const Value& obj, const std::string& name);
  Value binary(BinOp op, const Value& a, const Value& b);
  bool contains(const Value& container, const Value& item);
  Value call(const Value& fn, Args& args);
  Value call_macro(const Macro& m, Args& args);
  NsP new_namespace();
  // A test or filter by name (the `select`/`map` family call them by name).
  bool run_test(const std::string& name, const Value& v, Args& args);
  Value run_filter(const std::string& name, const Value& v, Args& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  const Program& prog_;
  const RenderOptions& opts_;
  const ChatTemplateLimits& lim_;
  uint64_t steps_ = 0, work_ = 0;
  int depth_ = 0, calls_ = 0;
  std::string* out_ = nullptr;
  std::shared_ptr<Scope> globals_, top_, scope_;
  std::vector<NsP> namespaces_;     // every namespace made, cleared at the end (cycles)
  const Value* block_input_ = nullptr;  // a filter block's or set block's rendered body

  [[noreturn]] void over_steps();
  void write(const std::string& s);
  void write(const Value& v);
  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  [[gnu::noinline]] Flow exec_for(const Stmt& s);
  Flow render_body(const Body& body, std::shared_ptr<Scope> scope, std::string& out);
  void assign(const Expr& target, const Value& v);
  Value lookup(const std::string& name) const;
  Value eval(const Expr& e);
  Value eval_node(const Expr& e);
  [[gnu::noinline]] Flow exec_block_text(const Stmt& s);
  [[gnu::noinline]] void define_macro(const Stmt& s);
  [[gnu::noinline]] void exec_call_block(const Stmt& s);
  [[gnu::noinline]] Flow exec_with(const Stmt& s);
  [[gnu::noinline]] Value eval_sequence(const Expr& e);
  [[gnu::noinline]] Value eval_dict(const Expr& e);
  [[gnu::noinline]] Value eval_getattr(const Expr& e);
  [[gnu::noinline]] Value eval_getitem(const Expr& e);
  [[gnu::noinline]] Value eval_call(const Expr& e);
  [[gnu::noinline]] Value eval_filter(const Expr& e);
  [[gnu::noinline]] Value eval_test(const Expr& e);
  [[gnu::noinline]] Value eval_unary(const Expr& e);
  [[gnu::noinline]] Value eval_logic(const Expr& e);
  [[gnu::noinline]] Value eval_cond(const Expr& e);
  [[gnu::noinline]] Value eval_binary(const Expr& e);
  [[gnu::noinline]] Value eval_concat(const Expr& e);
  Args eval_args(const Expr& e, size_t first);
  [[gnu::noinline]] Value eval_compare(const Expr& e);
  [[gnu::noinline]] Value eval_slice(const Value& obj, const Expr& slice);
  friend struct Macro;
};

// Builtins (builtins.cpp).
using FilterFn = Value (*)(Interp&, const Value&, Args&);
using TestFn = bool (*)(Interp&, const Value&, Args&);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// A method of a str, dict, list or loop object by name: a callable value, an "unsafe" undefined
// (what the immutable sandbox refuses: list.append...), or nullopt when there is no such method.
std::optional<Value> method_of(const Value& self, const std::string& name);
// The loop object's attributes (loop.index...); nullopt for an unknown name.
std::optional<Value> loop_attr(const Value& loop, const std::string& name);
void install_globals(Scope& globals);

// Binds a builtin's arguments by name: one slot per parameter (nullopt: not given); throws
// Python's TypeError messages for too many, unknown or repeated arguments.
std::vector<std::optional<Value>> bind_args(const char* fname, Args& a, std::initializer_list<const char*> names);
// Python's `str % args` (printf-style formatting: %s %r %d %i %f %x %o %e %g %c %% with flags,
// width and precision).
std::string percent_format(Interp& in, const std::string& fmt, const Value& args);

// Python's slice.indices(len): start, stop, step, count.
struct SliceIdx {
  int64_t start, stop, step, count;
};
SliceIdx slice_indices(int64_t len, const Value& start, const Value& stop, const Value& step);

}  // namespace diffattn::tokenize::jinja
