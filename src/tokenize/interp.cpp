// The chat-template interpreter (interp.h): statements and expressions with jinja2's semantics.
// Scopes: a for loop's body gets a fresh scope per turn (what it sets is gone at the next turn
// and after the loop), as do macro calls, {% with %} and block bodies; `if` has none. Names
// resolve innermost first, then the render variables, then the globals.
#include "tokenize/interp.h"

#include <cmath>
#include <limits>

namespace diffattn::tokenize::jinja {

namespace {

// Interpreter recursion (nested expressions, statements and macro calls together): each level
// is a few C++ frames, so this bounds the stack a template can use.
constexpr int kMaxEvalDepth = 800;

struct DepthGuard {
  int& depth;
  explicit DepthGuard(int& d) : depth(d) {
    if (++depth > kMaxEvalDepth) {
      --depth;
      fail(Kind::kLimit, "the template recurses deeper than " + std::to_string(kMaxEvalDepth) + " levels");
    }
  }
  ~DepthGuard() { --depth; }
};

template <class T>
struct Restore {
  T& ref;
  T saved;
  explicit Restore(T& r) : ref(r), saved(r) {}
  ~Restore() { ref = std::move(saved); }
};

void attach(RenderError& e, Pos p) {
  if (e.line == 0) {
    e.line = p.line;
    e.col = p.col;
  }
}

[[noreturn]] void int_overflow() {
  fail(Kind::kValue, "integer overflow (this engine's integers are 64-bit)");
}

std::string py_quote(const std::string& s) {
  std::string out;
  append_str_repr(out, s);
  return out;
}

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  type_error(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

// Python's float divmod (floatobject.c), for // and % on floats.
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

int64_t checked_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, base, &result)) int_overflow();
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) int_overflow();
  }
  return result;
}

}  // namespace

Value Macro::call(Interp& in, Args& args) const { return in.call_macro(*this, args); }

Interp::Interp(const Program& prog, const RenderOptions& options)
    : prog_(prog), opts_(options), lim_(prog.limits) {
  globals_ = std::make_shared<Scope>();
  install_globals(*globals_);
  top_ = std::make_shared<Scope>();
  top_->parent = globals_;
  scope_ = top_;
}

Interp::~Interp() {
  // Namespaces are the only mutable values, so the only way to a reference cycle (a namespace
  // holding itself) or to a chain of unbounded depth: empty each one, one at a time.
  for (const NsP& ns : namespaces_) ns->attrs = DictData{};
}

void Interp::over_steps() {
  fail(Kind::kLimit, "the template took more than " + std::to_string(lim_.max_steps) + " steps");
}

void Interp::build_str(size_t bytes) {
  if (bytes > lim_.max_output_bytes) {
    fail(Kind::kLimit, "a string of " + std::to_string(bytes) + " bytes is longer than the limit of " +
                           std::to_string(lim_.max_output_bytes));
  }
  work_ += bytes;
  if (work_ > lim_.max_work_bytes) {
    fail(Kind::kLimit, "the template built more than " + std::to_string(lim_.max_work_bytes) + " bytes of strings");
  }
}

void Interp::build_items(size_t n) {
  if (n > lim_.max_items) {
    fail(Kind::kLimit, "a list or dict of " + std::to_string(n) + " elements is longer than the limit of " +
                           std::to_string(lim_.max_items));
  }
  step(n);
}

NsP Interp::new_namespace() {
  auto ns = std::make_shared<NsData>();
  namespaces_.push_back(ns);
  return ns;
}

std::string Interp::render(std::vector<std::pair<std::string, Value>> vars) {
  for (auto& [k, v] : vars) top_->vars[k] = std::move(v);
  std::string out;
  out_ = &out;
  exec_body(prog_.body);
  out_ = nullptr;
  return out;
}

void Interp::write(const std::string& s) {
  if (out_->size() + s.size() > lim_.max_output_bytes) {
    fail(Kind::kLimit, "the rendering is longer than " + std::to_string(lim_.max_output_bytes) + " bytes");
  }
  work_ += s.size();
  if (work_ > lim_.max_work_bytes) {
    fail(Kind::kLimit, "the template built more than " + std::to_string(lim_.max_work_bytes) + " bytes of strings");
  }
  out_->append(s);
}

void Interp::write(const Value& v) {
  if (v.is_str()) {
    write(v.str());
  } else {
    std::string s;
    append_str(s, v);
    write(s);
  }
}

// ---- statements ----

Interp::Flow Interp::exec_body(const Body& body) {
  for (const StmtP& s : body) {
    const Flow f = exec(*s);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interp::Flow Interp::render_body(const Body& body, std::shared_ptr<Scope> scope, std::string& out) {
  Restore<std::string*> ro(out_);
  Restore<std::shared_ptr<Scope>> rs(scope_);
  out_ = &out;
  scope_ = std::move(scope);
  return exec_body(body);
}

Interp::Flow Interp::exec(const Stmt& s) {
  DepthGuard g(depth_);
  step();
  try {
    switch (s.kind) {
      case StmtKind::kText: write(s.text); return Flow::kNormal;
      case StmtKind::kPrint: write(eval(*s.expr)); return Flow::kNormal;
      case StmtKind::kIf: {
        if (truthy(eval(*s.expr))) return exec_body(s.body);
        for (const auto& [cond, body] : s.elifs) {
          if (truthy(eval(*cond))) return exec_body(body);
        }
        return exec_body(s.else_body);
      }
      case StmtKind::kFor: return exec_for(s);
      case StmtKind::kSet: assign(*s.target, eval(*s.expr)); return Flow::kNormal;
      case StmtKind::kSetBlock:
      case StmtKind::kFilterBlock: return exec_block_text(s);
      case StmtKind::kMacro: define_macro(s); return Flow::kNormal;
      case StmtKind::kCallBlock: exec_call_block(s); return Flow::kNormal;
      case StmtKind::kWith: return exec_with(s);
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kBlock: return exec_body(s.body);
    }
  } catch (RenderError& e) {
    attach(e, s.pos);
    throw;
  }
  return Flow::kNormal;
}

// {% set x %}...{% endset %} and {% filter f %}...{% endfilter %}: the body rendered to a string,
// through the filter chain if there is one.
Interp::Flow Interp::exec_block_text(const Stmt& s) {
  auto scope = std::make_shared<Scope>();
  scope->parent = scope_;
  std::string text;
  const Flow f = render_body(s.body, scope, text);
  if (s.kind == StmtKind::kSetBlock && f != Flow::kNormal) return f;
  Value v(std::move(text));
  if (s.filter) {
    Restore<const Value*> rb(block_input_);
    block_input_ = &v;
    v = eval(*s.filter);
  }
  if (s.kind == StmtKind::kSetBlock) {
    assign(*s.target, v);
  } else {
    write(v);
  }
  return f;
}

void Interp::define_macro(const Stmt& s) {
  auto m = std::make_shared<Macro>();
  m->def = &s;
  m->scope = scope_;
  m->name = s.text;
  scope_->vars[s.text] = Value(FnP(std::move(m)));
}

void Interp::exec_call_block(const Stmt& s) {
  const Expr& call = *s.expr;
  const Value callee = eval(*call.args[0]);
  Args a = eval_args(call, 1);
  auto caller = std::make_shared<Macro>();
  caller->def = &s;
  caller->scope = scope_;
  caller->name = "caller";
  a.kw.emplace_back("caller", Value(FnP(std::move(caller))));
  write(this->call(callee, a));
}

Interp::Flow Interp::exec_with(const Stmt& s) {
  auto scope = std::make_shared<Scope>();
  scope->parent = scope_;
  for (size_t i = 0; i < s.params.size(); ++i) scope->vars[s.params[i]] = eval(*s.values[i]);
  Restore<std::shared_ptr<Scope>> rs(scope_);
  scope_ = scope;
  return exec_body(s.body);
}

Interp::Flow Interp::exec_for(const Stmt& s) {
  const Value it = eval(*s.expr);
  if (it.is_loop()) type_error("iterating over the loop object is not supported");
  std::vector<Value> items = iterate(it);
  step(items.size());
  const std::shared_ptr<Scope> outer = scope_;
  Restore<std::shared_ptr<Scope>> rs(scope_);
  if (s.cond) {  // `for x in xs if cond`: the loop sees only the items that pass
    std::vector<Value> kept;
    for (Value& v : items) {
      auto scope = std::make_shared<Scope>();
      scope->parent = outer;
      scope_ = scope;
      assign(*s.target, v);
      if (truthy(eval(*s.cond))) kept.push_back(std::move(v));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto scope = std::make_shared<Scope>();
    scope->parent = outer;
    scope_ = scope;
    return exec_body(s.else_body);  // a break here belongs to an outer loop
  }
  auto list = std::make_shared<ListData>();
  list->items = std::move(items);
  auto loop = std::make_shared<LoopData>();
  loop->items = list;
  const Value loopv(loop);
  for (size_t i = 0; i < list->items.size(); ++i) {
    step();
    loop->index0 = i;
    auto scope = std::make_shared<Scope>();
    scope->parent = outer;
    scope_ = scope;
    scope->vars["loop"] = loopv;
    assign(*s.target, list->items[i]);
    if (exec_body(s.body) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interp::assign(const Expr& t, const Value& v) {
  switch (t.kind) {
    case ExprKind::kName: scope_->vars[t.name] = v; return;
    case ExprKind::kTuple: {
      const std::vector<Value> parts = iterate(v);
      const size_t n = t.args.size();
      if (parts.size() > n) fail(Kind::kValue, "too many values to unpack (expected " + std::to_string(n) + ")");
      if (parts.size() < n) {
        fail(Kind::kValue, "not enough values to unpack (expected " + std::to_string(n) + ", got " +
                               std::to_string(parts.size()) + ")");
      }
      for (size_t i = 0; i < n; ++i) assign(*t.args[i], parts[i]);
      return;
    }
    case ExprKind::kNsRef: {
      const Value ns = lookup(t.name);
      if (!ns.is_ns()) fail(Kind::kType, "cannot assign attribute on non-namespace object");
      if (!t.attr.empty() && t.attr[0] == '_') {
        fail(Kind::kSecurity, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
                                  py_quote(t.attr) + ". Please rename the attribute.");
      }
      ns.ns().attrs.set(Value(t.attr), v);
      return;
    }
    default: fail(Kind::kSyntax, "can't assign to this expression");
  }
}

Value Interp::lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s != nullptr; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  return Value::undefined(py_quote(name) + " is undefined");
}

// ---- macros ----

Value Interp::call_macro(const Macro& m, Args& args) {
  if (calls_ >= lim_.max_call_depth) {
    fail(Kind::kLimit, "macros call each other deeper than " + std::to_string(lim_.max_call_depth) + " levels");
  }
  ++calls_;
  struct Dec {
    int& c;
    ~Dec() { --c; }
  } dec{calls_};
  const Stmt& d = *m.def;
  auto scope = std::make_shared<Scope>();
  std::shared_ptr<Scope> parent = m.scope.lock();
  scope->parent = parent ? parent : top_;
  const size_t n = d.params.size();
  std::vector<bool> given(n, false);
  for (size_t i = 0; i < n && i < args.pos.size(); ++i) {
    scope->vars[d.params[i]] = args.pos[i];
    given[i] = true;
  }
  std::vector<std::pair<std::string, Value>> rest;
  for (auto& [k, v] : args.kw) {
    size_t j = 0;
    while (j < n && d.params[j] != k) ++j;
    if (j < n && !given[j]) {
      scope->vars[k] = v;
      given[j] = true;
    } else {
      rest.emplace_back(k, v);
    }
  }
  const std::string mname = "macro " + py_quote(m.name);
  if (d.kind == StmtKind::kMacro && d.uses_caller && std::find(d.params.begin(), d.params.end(), "caller") == d.params.end()) {
    Value caller = Value::undefined("No caller defined");
    for (size_t i = 0; i < rest.size(); ++i) {
      if (rest[i].first == "caller") {
        caller = rest[i].second;
        rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
    scope->vars["caller"] = caller;
  }
  if (d.uses_kwargs) {
    DictData kw;
    for (auto& [k, v] : rest) kw.set(Value(k), v);
    scope->vars["kwargs"] = make_dict(std::move(kw));
  } else if (!rest.empty()) {
    type_error(mname + " takes no keyword argument " + py_quote(rest[0].first));
  }
  if (args.pos.size() > n) {
    if (!d.uses_varargs) type_error(mname + " takes not more than " + std::to_string(n) + " argument(s)");
    scope->vars["varargs"] = make_list(std::vector<Value>(args.pos.begin() + static_cast<std::ptrdiff_t>(n), args.pos.end()),
                                       ListKind::kTuple);
  } else if (d.uses_varargs) {
    scope->vars["varargs"] = make_list({}, ListKind::kTuple);
  }
  {
    Restore<std::shared_ptr<Scope>> rs(scope_);
    scope_ = scope;
    const size_t first_default = n - d.defaults.size();
    for (size_t i = 0; i < n; ++i) {
      if (given[i]) continue;
      scope->vars[d.params[i]] = i >= first_default ? eval(*d.defaults[i - first_default])
                                                    : Value::undefined("parameter " + py_quote(d.params[i]) + " was not provided");
    }
  }
  std::string text;
  render_body(d.body, scope, text);
  return Value(std::move(text));
}

// ---- expressions ----

Value Interp::eval(const Expr& e) {
  DepthGuard g(depth_);
  step();
  try {
    return eval_node(e);
  } catch (RenderError& err) {
    attach(err, e.pos);
    throw;
  }
}

Args Interp::eval_args(const Expr& e, size_t first) {
  Args a;
  for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
  if (e.dyn_args) {
    const Value v = eval(*e.dyn_args);
    for (Value& x : iterate(v)) a.pos.push_back(std::move(x));
  }
  if (e.dyn_kwargs) {
    const Value v = eval(*e.dyn_kwargs);
    if (!v.is_dict()) type_error("argument after ** must be a mapping, not " + type_name(v));
    for (const auto& [k, x] : v.dict().items) {
      if (!k.is_str()) type_error("keywords must be strings");
      a.kw.emplace_back(k.str(), x);
    }
  }
  step(a.pos.size() + a.kw.size());
  return a;
}

// Each kind with locals of its own is a function of its own (never inlined), so that a level of
// recursion carries only the frame of the case it is in: with AddressSanitizer every local of
// one big switch would have its own stack slot in every level.
Value Interp::eval_node(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kConst: return e.value;
    case ExprKind::kName: return lookup(e.name);
    case ExprKind::kList:
    case ExprKind::kTuple: return eval_sequence(e);
    case ExprKind::kDict: return eval_dict(e);
    case ExprKind::kGetattr: return eval_getattr(e);
    case ExprKind::kGetitem: return eval_getitem(e);
    case ExprKind::kSlice: type_error("a slice is only allowed as a whole subscript");
    case ExprKind::kCall: return eval_call(e);
    case ExprKind::kFilter: return eval_filter(e);
    case ExprKind::kTest: return eval_test(e);
    case ExprKind::kNot: return Value(!truthy(eval(*e.args[0])));
    case ExprKind::kNeg:
    case ExprKind::kPos: return eval_unary(e);
    case ExprKind::kAnd:
    case ExprKind::kOr: return eval_logic(e);
    case ExprKind::kCond: return eval_cond(e);
    case ExprKind::kBinary: return eval_binary(e);
    case ExprKind::kConcat: return eval_concat(e);
    case ExprKind::kCompare: return eval_compare(e);
    case ExprKind::kNsRef: fail(Kind::kSyntax, "a namespace attribute reference is only allowed in set");
  }
  return Value();
}

Value Interp::eval_sequence(const Expr& e) {
  std::vector<Value> items;
  items.reserve(e.args.size());
  for (const auto& a : e.args) items.push_back(eval(*a));
  return make_list(std::move(items), e.kind == ExprKind::kList ? ListKind::kList : ListKind::kTuple);
}

Value Interp::eval_dict(const Expr& e) {
  DictData d;
  for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
    Value k = eval(*e.args[i]);
    d.set(std::move(k), eval(*e.args[i + 1]));
  }
  return make_dict(std::move(d));
}

Value Interp::eval_getattr(const Expr& e) { return getattr(eval(*e.args[0]), e.name); }

Value Interp::eval_getitem(const Expr& e) {
  const Value obj = eval(*e.args[0]);
  if (e.args[1]->kind == ExprKind::kSlice) return eval_slice(obj, *e.args[1]);
  return getitem(obj, eval(*e.args[1]));
}

Value Interp::eval_call(const Expr& e) {
  const Value fn = eval(*e.args[0]);
  Args a = eval_args(e, 1);
  return call(fn, a);
}

Value Interp::eval_filter(const Expr& e) {
  Value v;
  if (e.args[0]) {
    v = eval(*e.args[0]);
  } else if (block_input_ != nullptr) {
    v = *block_input_;
  }
  if (!e.known) fail(Kind::kSyntax, "No filter named " + py_quote(e.name) + " found.");
  Args a = eval_args(e, 1);
  return run_filter(e.name, v, a);
}

Value Interp::eval_test(const Expr& e) {
  const Value v = eval(*e.args[0]);
  if (!e.known) fail(Kind::kSyntax, "No test named " + py_quote(e.name) + " found.");
  Args a = eval_args(e, 1);
  return Value(run_test(e.name, v, a));
}

Value Interp::eval_unary(const Expr& e) {
  const Value v = eval(*e.args[0]);
  const bool neg = e.kind == ExprKind::kNeg;
  if (v.is_undefined()) v.raise_undefined();
  if (v.is_float()) return Value(neg ? -v.as_float() : v.as_float());
  if (v.is_integral()) {
    const int64_t i = v.as_int();
    if (!neg) return Value(i);
    if (i == std::numeric_limits<int64_t>::min()) int_overflow();
    return Value(-i);
  }
  type_error(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + type_name(v) + "'");
}

Value Interp::eval_logic(const Expr& e) {
  Value a = eval(*e.args[0]);
  if (e.kind == ExprKind::kAnd) return truthy(a) ? eval(*e.args[1]) : a;
  return truthy(a) ? a : eval(*e.args[1]);
}

Value Interp::eval_cond(const Expr& e) {
  if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
  if (e.args[2]) return eval(*e.args[2]);
  return Value::undefined("the inline if-expression on line " + std::to_string(e.pos.line) +
                          " evaluated to false and no else section was defined.");
}

Value Interp::eval_binary(const Expr& e) {
  const Value a = eval(*e.args[0]);
  const Value b = eval(*e.args[1]);
  return binary(e.op, a, b);
}

Value Interp::eval_concat(const Expr& e) {
  std::string s;
  bool ascii = true;
  for (const auto& a : e.args) {
    const Value v = eval(*a);
    const size_t before = s.size();
    append_str(s, v);
    build_str(s.size());
    if (v.is_str()) {
      ascii = ascii && v.str_p()->ascii;
    } else {
      for (size_t k = before; k < s.size() && ascii; ++k) ascii = static_cast<unsigned char>(s[k]) < 0x80;
    }
  }
  return make_str(std::move(s), ascii);
}

Value Interp::eval_compare(const Expr& e) {
  Value left = eval(*e.args[0]);
  for (size_t i = 0; i < e.cmps.size(); ++i) {
    Value right = eval(*e.args[i + 1]);
    bool r = false;
    switch (e.cmps[i]) {
      case CmpKind::kEq: r = equal(left, right); break;
      case CmpKind::kNe: r = !equal(left, right); break;
      case CmpKind::kLt: r = compare(left, right, CmpOp::kLt); break;
      case CmpKind::kLe: r = compare(left, right, CmpOp::kLe); break;
      case CmpKind::kGt: r = compare(left, right, CmpOp::kGt); break;
      case CmpKind::kGe: r = compare(left, right, CmpOp::kGe); break;
      case CmpKind::kIn: r = contains(right, left); break;
      case CmpKind::kNotIn: r = !contains(right, left); break;
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

bool Interp::contains(const Value& c, const Value& item) {
  switch (c.type()) {
    case Value::kUndefined: return false;
    case Value::kStr:
      if (!item.is_str()) type_error("'in <string>' requires string as left operand, not " + type_name(item));
      step(c.str().size() / 64);
      return find_sub(c.str(), item.str()) != std::string::npos;
    case Value::kList:
      for (const Value& v : c.list().items) {
        step();
        if (equal(v, item)) return true;
      }
      return false;
    case Value::kDict: return c.dict().find(item) != nullptr;
    default: type_error("argument of type '" + type_name(c) + "' is not iterable");
  }
}

Value Interp::binary(BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.raise_undefined();
  if (b.is_undefined()) b.raise_undefined();
  const bool nums = a.is_number() && b.is_number();
  const bool ints = a.is_integral() && b.is_integral();
  switch (op) {
    case BinOp::kAdd: {
      if (ints) {
        int64_t r;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) int_overflow();
        return Value(r);
      }
      if (nums) return Value(a.as_float() + b.as_float());
      if (a.is_str() && b.is_str()) {
        build_str(a.str().size() + b.str().size());
        return make_str(a.str() + b.str(), a.str_p()->ascii && b.str_p()->ascii);
      }
      if (a.is_list() && b.is_list() && a.list().kind == b.list().kind &&
          (a.list().kind == ListKind::kList || a.list().kind == ListKind::kTuple)) {
        build_items(a.list().items.size() + b.list().items.size());
        std::vector<Value> items = a.list().items;
        items.insert(items.end(), b.list().items.begin(), b.list().items.end());
        return make_list(std::move(items), a.list().kind);
      }
      if (a.is_str() || (a.is_list() && (a.list().kind == ListKind::kList || a.list().kind == ListKind::kTuple))) {
        type_error("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
      }
      unsupported("+", a, b);
    }
    case BinOp::kSub: {
      if (ints) {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) int_overflow();
        return Value(r);
      }
      if (nums) return Value(a.as_float() - b.as_float());
      unsupported("-", a, b);
    }
    case BinOp::kMul: {
      if (ints) {
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) int_overflow();
        return Value(r);
      }
      if (nums) return Value(a.as_float() * b.as_float());
      const Value* seq = a.is_integral() ? &b : &a;
      const Value* count = a.is_integral() ? &a : &b;
      if (count->is_integral() && (seq->is_str() || (seq->is_list() && (seq->list().kind == ListKind::kList ||
                                                                        seq->list().kind == ListKind::kTuple)))) {
        const int64_t n = std::max<int64_t>(count->as_int(), 0);
        if (seq->is_str()) {
          const std::string& s = seq->str();
          if (n > 0 && s.size() > lim_.max_output_bytes / static_cast<uint64_t>(n)) build_str(lim_.max_output_bytes + 1);
          build_str(s.size() * static_cast<size_t>(n));
          std::string out;
          out.reserve(s.size() * static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) out += s;
          return make_str(std::move(out), seq->str_p()->ascii);
        }
        const auto& items = seq->list().items;
        if (n > 0 && items.size() > lim_.max_items / static_cast<uint64_t>(n)) build_items(lim_.max_items + 1);
        build_items(items.size() * static_cast<size_t>(n));
        std::vector<Value> out;
        out.reserve(items.size() * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
        return make_list(std::move(out), seq->list().kind);
      }
      if ((seq->is_str() || seq->is_list()) && count->is_float()) {
        type_error("can't multiply sequence by non-int of type 'float'");
      }
      unsupported("*", a, b);
    }
    case BinOp::kDiv: {
      if (!nums) unsupported("/", a, b);
      if (b.as_float() == 0.0) fail(Kind::kValue, ints ? "division by zero" : "float division by zero");
      if (ints) return Value(static_cast<double>(static_cast<long double>(a.as_int()) / static_cast<long double>(b.as_int())));
      return Value(a.as_float() / b.as_float());
    }
    case BinOp::kFloorDiv:
    case BinOp::kMod: {
      const bool mod = op == BinOp::kMod;
      if (mod && a.is_str()) {
        const std::string s = percent_format(*this, a.str(), b);
        build_str(s.size());
        return Value(s);
      }
      if (!nums) unsupported(mod ? "%" : "//", a, b);
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) fail(Kind::kValue, "integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (mod) return Value(int64_t{0});
          int_overflow();
        }
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          r += y;
          --q;
        }
        return Value(mod ? r : q);
      }
      const double y = b.as_float();
      if (y == 0.0) fail(Kind::kValue, mod ? "float modulo" : "float floor division by zero");
      double q, r;
      float_divmod(a.as_float(), y, q, r);
      return Value(mod ? r : q);
    }
    case BinOp::kPow: {
      if (!nums) unsupported("** or pow()", a, b);
      if (ints && b.as_int() >= 0) return Value(checked_pow(a.as_int(), b.as_int()));
      const double x = a.as_float(), y = b.as_float();
      if (x == 0.0 && y < 0) fail(Kind::kValue, "0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) fail(Kind::kValue, "a negative number to a fractional power is complex (not supported)");
      const double r = std::pow(x, y);
      if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) fail(Kind::kValue, "(34, 'Numerical result out of range')");
      return Value(r);
    }
  }
  return Value();
}

SliceIdx slice_indices(int64_t len, const Value& start, const Value& stop, const Value& step) {
  auto get = [](const Value& v, int64_t dflt) -> int64_t {
    if (v.is_none()) return dflt;
    if (!v.is_integral()) type_error("slice indices must be integers or None or have an __index__ method");
    constexpr int64_t kBig = int64_t{1} << 62;
    return std::clamp(v.as_int(), -kBig, kBig);
  };
  const int64_t st = get(step, 1);
  if (st == 0) fail(Kind::kValue, "slice step cannot be zero");
  int64_t a = get(start, st < 0 ? len - 1 : 0);
  int64_t b = get(stop, st < 0 ? -1 : len);
  auto adjust = [&](int64_t& x, bool given) {
    if (!given) return;
    if (x < 0) {
      x += len;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= len) {
      x = st < 0 ? len - 1 : len;
    }
  };
  adjust(a, !start.is_none());
  adjust(b, !stop.is_none());
  int64_t count = 0;
  if (st < 0) {
    if (b < a) count = (a - b - 1) / (-st) + 1;
  } else if (a < b) {
    count = (b - a - 1) / st + 1;
  }
  return SliceIdx{a, b, st, count};
}

Value Interp::eval_slice(const Value& obj, const Expr& sl) {
  Value parts[3];
  for (int i = 0; i < 3; ++i) {
    if (sl.args[static_cast<size_t>(i)]) parts[i] = eval(*sl.args[static_cast<size_t>(i)]);
  }
  // jinja2 compiles a slice to Python's own obj[a:b:c] (not the sandbox's getitem), so what
  // cannot be sliced is a TypeError, not an undefined value.
  if (obj.is_undefined()) obj.raise_undefined();
  const bool seq = obj.is_str() || (obj.is_list() && (obj.list().kind == ListKind::kList || obj.list().kind == ListKind::kTuple ||
                                                      obj.list().kind == ListKind::kRange));
  if (obj.is_dict()) type_error("unhashable type: 'slice'");
  if (!seq) type_error("'" + type_name(obj) + "' object is not subscriptable");
  for (const Value& p : parts) {
    if (p.is_undefined()) p.raise_undefined();
    if (!p.is_none() && !p.is_integral()) type_error("slice indices must be integers or None or have an __index__ method");
  }
  const int64_t len = length(obj);
  const SliceIdx ix = slice_indices(len, parts[0], parts[1], parts[2]);
  step(static_cast<uint64_t>(ix.count));
  if (obj.is_str()) {
    if (!obj.str_p()->ascii) step(obj.str().size() / 64);  // the code points' offsets
    std::string s = str_slice_cps(*obj.str_p(), ix.start, ix.stop, ix.step);
    const bool ascii = obj.str_p()->ascii;
    return make_str(std::move(s), ascii);
  }
  const ListData& l = obj.list();
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(ix.count));
  for (int64_t k = 0, i = ix.start; k < ix.count; ++k, i += ix.step) items.push_back(l.items[static_cast<size_t>(i)]);
  if (l.kind == ListKind::kRange) {
    auto r = std::make_shared<ListData>();
    r->kind = ListKind::kRange;
    r->start = l.start + ix.start * l.step;
    r->step = l.step * ix.step;
    r->stop = r->start + ix.count * r->step;
    r->items = std::move(items);
    return Value(ListP(std::move(r)));
  }
  return make_list(std::move(items), l.kind);
}

std::optional<Value> Interp::attribute(const Value& obj, const std::string& name) {
  switch (obj.type()) {
    case Value::kNamespace: {
      if (const Value* v = obj.ns().attrs.find(Value(name))) return *v;
      return std::nullopt;
    }
    case Value::kLoop: return loop_attr(obj, name);
    default: return method_of(obj, name);
  }
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) obj.raise_undefined();
  if (auto a = attribute(obj, name)) return *a;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(Value(name))) return *v;
  }
  return Value::undefined(py_quote(object_type_repr(obj)) + " has no attribute " + py_quote(name));
}

Value Interp::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.raise_undefined();
  if (obj.is_dict()) {
    if (hash_key(key)) {
      if (const Value* v = obj.dict().find(key)) return *v;
    }
  } else if (key.is_integral() && (obj.is_str() || (obj.is_list() && (obj.list().kind == ListKind::kList ||
                                                                      obj.list().kind == ListKind::kTuple ||
                                                                      obj.list().kind == ListKind::kRange)))) {
    const int64_t len = length(obj);
    int64_t i = key.as_int();
    if (i < 0) i += len;
    if (i >= 0 && i < len) {
      if (obj.is_str() && !obj.str_p()->ascii) step(static_cast<uint64_t>(i) / 64);  // a walk to code point i
      return obj.is_str() ? str_at(*obj.str_p(), i) : obj.list().items[static_cast<size_t>(i)];
    }
  }
  if (key.is_str()) {
    if (auto a = attribute(obj, key.str())) return *a;
    return Value::undefined(py_quote(object_type_repr(obj)) + " has no attribute " + py_quote(key.str()));
  }
  return Value::undefined(object_type_repr(obj) + " has no element " + repr(key));
}

Value Interp::call(const Value& fn, Args& args) {
  if (fn.is_undefined()) fn.raise_undefined();
  if (!fn.is_callable()) type_error("'" + type_name(fn) + "' object is not callable");
  return fn.fn().call(*this, args);
}

bool Interp::run_test(const std::string& name, const Value& v, Args& args) {
  const TestFn f = find_test(name);
  if (f == nullptr) fail(Kind::kSyntax, "No test named " + py_quote(name) + ".");
  return f(*this, v, args);
}

Value Interp::run_filter(const std::string& name, const Value& v, Args& args) {
  const FilterFn f = find_filter(name);
  if (f == nullptr) fail(Kind::kSyntax, "No filter named " + py_quote(name) + ".");
  return f(*this, v, args);
}

}  // namespace diffattn::tokenize::jinja
