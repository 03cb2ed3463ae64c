// The chat-template engine's syntax tree: what parser.cpp builds from a template's text (the
// lexer and parser follow jinja2's lexer.py and parser.py rule for rule, with transformers'
// settings trim_blocks and lstrip_blocks) and interp.cpp walks. Every node keeps its line and
// column (in code points) for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenize/value.h"

namespace diffattn::tokenize::jinja {

struct Pos {
  int line = 1, col = 1;
};

enum class ExprKind {
  kConst,    // value
  kName,     // name
  kList,     // args: items
  kTuple,    // args: items
  kDict,     // args: key, value, key, value...
  kGetattr,  // args[0] . name
  kGetitem,  // args[0] [ args[1] ]
  kSlice,    // args: start, stop, step (each may be null)
  kCall,     // args[0] ( args[1..], kwargs, dyn_args, dyn_kwargs )
  kFilter,   // name; args[0] the value (null in a filter block), then the arguments
  kTest,     // name; args[0] the value, then the arguments
  kNot,
  kNeg,
  kPos,
  kAnd,
  kOr,
  kCond,     // args: then, test, else (else may be null)
  kBinary,   // op; args: left, right
  kConcat,   // args: parts
  kCompare,  // args[0], then ops[i] against args[i + 1]
  kNsRef,    // name . attr (an assignment target)
};

enum class BinOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpKind { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  Pos pos;
  Value value;                  // kConst
  std::string name;             // kName, kGetattr, kFilter, kTest, kNsRef (the namespace)
  std::string attr;             // kNsRef
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;  // kCall, kFilter, kTest
  ExprP dyn_args, dyn_kwargs;   // *args, **kwargs
  BinOp op = BinOp::kAdd;
  std::vector<CmpKind> cmps;
  // kFilter / kTest: whether the name is known (an unknown one inside an if or an inline if is
  // an error only when it is reached, as jinja2 compiles it).
  bool known = true;
  int depth = 1;  // of the tree below (parse_program bounds it, so walking it cannot overflow)
};

enum class StmtKind {
  kText,     // text
  kPrint,    // expr
  kIf,       // expr; body; elifs; else_body
  kFor,      // target in expr [if cond]; body; else_body
  kSet,      // target = expr
  kSetBlock, // target; filter (may be null); body
  kMacro,    // name(params = defaults); body
  kCallBlock,// expr (the call); params/defaults of caller; body
  kFilterBlock,  // filter; body
  kWith,     // targets = values; body
  kBreak,
  kContinue,
  kBlock,    // body (transformers' {% generation %}: rendered as is)
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

struct Stmt {
  StmtKind kind;
  Pos pos;
  std::string text;       // kText; kMacro: the name
  ExprP expr;             // kPrint, kIf, kFor (iterable), kSet (value), kCallBlock (the call)
  ExprP target;           // kFor, kSet, kSetBlock: kName, kTuple of kName, or kNsRef
  ExprP cond;             // kFor's `if`
  ExprP filter;           // kSetBlock, kFilterBlock: a kFilter chain on a null value
  Body body, else_body;
  std::vector<std::pair<ExprP, Body>> elifs;  // kIf
  std::vector<std::string> params;  // kMacro, kCallBlock (the caller's)
  std::vector<ExprP> defaults;      // for the last params
  std::vector<ExprP> values;        // kWith: targets in `params`
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;  // kMacro, kCallBlock
};

// A parsed template.
struct Program {
  std::string name;
  Body body;
  ChatTemplateLimits limits;
};

// Parses a template (limits.max_source_bytes, limits.max_nesting); throws RenderError (kSyntax,
// kLimit) with the position set.
std::unique_ptr<Program> parse_program(std::string_view source, std::string name, const ChatTemplateLimits& limits);

// The filters and tests the engine has (builtins.cpp).
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace diffattn::tokenize::jinja
