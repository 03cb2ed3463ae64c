// The chat-template lexer and parser (ast.h). Both follow jinja2 3.1 (lexer.py, parser.py) rule
// for rule with transformers' settings: newlines normalised to \n and one trailing newline
// dropped; `{%- -%}` strip whitespace (Python's \s); trim_blocks drops the newline after a block
// or comment tag; lstrip_blocks drops spaces before a block or comment tag that starts a line;
// `+` turns either off. Operator precedence is jinja2's (filters bind tighter than `+`).
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "tokenize/ast.h"
#include "tokenize/unicode.h"

namespace diffattn::tokenize::jinja {

namespace {

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // data, name, operator, the decoded string
  Value num;         // kInt, kFloat
  Pos pos;
};

[[noreturn]] void syntax_error(const std::string& msg, Pos p) {
  throw RenderError{Kind::kSyntax, msg, p.line, p.col};
}

// ---- lexer ----

class Lexer {
 public:
  explicit Lexer(std::string_view src) : s_(src), n_(src.size()) {}

  std::vector<Token> run() {
    while (pos_ < n_) root();
    emit(Tok::kEof, "", n_);
    return std::move(toks_);
  }

 private:
  std::string_view s_;
  size_t n_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<char> balance_;
  std::vector<Token> toks_;
  // Incremental offset -> (line, column): tokens come in source order.
  size_t at_ = 0;
  Pos at_pos_;

  Pos pos_of(size_t off) {
    off = std::min(off, n_);
    if (off < at_) {  // not expected; recount from the start
      at_ = 0;
      at_pos_ = Pos{};
    }
    while (at_ < off) {
      const auto c = static_cast<unsigned char>(s_[at_]);
      if (c == '\n') {
        ++at_pos_.line;
        at_pos_.col = 1;
      } else if ((c & 0xC0) != 0x80) {
        ++at_pos_.col;
      }
      ++at_;
    }
    return at_pos_;
  }

  void emit(Tok t, std::string text, size_t off, Value num = Value()) {
    toks_.push_back(Token{t, std::move(text), std::move(num), pos_of(off)});
  }

  [[noreturn]] void error(const std::string& msg, size_t off) { syntax_error(msg, pos_of(off)); }

  bool starts(size_t p, const char* lit) const {
    const size_t len = std::strlen(lit);
    return p + len <= n_ && s_.compare(p, len, lit) == 0;
  }
  uint32_t cp_at(size_t p, size_t* next = nullptr) const {
    size_t i = p;
    const uint32_t c = unicode::next_cp(s_, i);
    if (next) *next = i;
    return c;
  }
  // Past Python's \s* from p.
  size_t skip_ws(size_t p) const {
    while (p < n_) {
      size_t q;
      if (!unicode::is_space(cp_at(p, &q))) break;
      p = q;
    }
    return p;
  }
  static std::string_view rstrip(std::string_view t) {
    size_t end = t.size();
    while (end > 0) {
      size_t k = end - 1;
      while (k > 0 && (static_cast<unsigned char>(t[k]) & 0xC0) == 0x80) --k;
      size_t q = k;
      if (!unicode::is_space(unicode::next_cp(t, q))) break;
      end = k;
    }
    return t.substr(0, end);
  }
  static bool all_space(std::string_view t) {
    for (size_t i = 0; i < t.size();) {
      if (!unicode::is_space(unicode::next_cp(t, i))) return false;
    }
    return true;
  }
  // The text before a tag, with the tag's whitespace control applied (jinja2's OptionalLStrip).
  std::string_view strip_before(std::string_view text, char sign, bool variable) const {
    if (sign == '-') return rstrip(text);
    if (sign != '+' && !variable) {  // lstrip_blocks
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_space(text.substr(l_pos))) {
        return text.substr(0, l_pos);
      }
    }
    return text;
  }

  void root() {
    size_t k = pos_;
    while (true) {
      k = s_.find('{', k);
      if (k == std::string_view::npos || k + 1 >= n_) {
        emit(Tok::kData, std::string(s_.substr(pos_)), pos_);
        pos_ = n_;
        return;
      }
      const char t = s_[k + 1];
      if (t == '{' || t == '%' || t == '#') break;
      ++k;
    }
    const char t = s_[k + 1];
    size_t after = k + 2;
    char sign = 0;
    if (after < n_ && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
    // {% raw %}: \{%(-|+|)\s*raw\s*(?:-%}\s*|%})
    size_t raw_end = 0;
    if (t == '%') {
      size_t p = skip_ws(after);
      if (starts(p, "raw")) {
        p = skip_ws(p + 3);
        if (starts(p, "-%}")) {
          raw_end = skip_ws(p + 3);
        } else if (starts(p, "%}")) {
          raw_end = p + 2;
        }
      }
    }
    const std::string_view text = strip_before(s_.substr(pos_, k - pos_), sign, t == '{');
    if (!text.empty()) emit(Tok::kData, std::string(text), pos_);
    if (raw_end != 0) {
      line_starting_ = s_[raw_end - 1] == '\n';
      pos_ = raw_end;
      raw();
      return;
    }
    line_starting_ = false;
    pos_ = after;
    if (t == '#') {
      comment(k);
    } else {
      emit(t == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", k);
      tag(t == '{', k);
    }
  }

  void comment(size_t begin) {
    const size_t q = s_.find("#}", pos_);
    if (q == std::string_view::npos) error("Missing end of comment tag", begin);
    char sign = 0;
    if (q > pos_ && (s_[q - 1] == '-' || s_[q - 1] == '+')) sign = s_[q - 1];
    size_t end = q + 2;
    if (sign == '-') {
      end = skip_ws(end);
    } else if (sign != '+' && end < n_ && s_[end] == '\n') {
      ++end;  // trim_blocks
    }
    line_starting_ = s_[end - 1] == '\n';
    pos_ = end;
  }

  void raw() {
    // (.*?)((?:\{%(-|+|))\s*endraw\s*(?:+%}|-%}\s*|%}\n?))
    size_t k = pos_;
    while (true) {
      k = s_.find("{%", k);
      if (k == std::string_view::npos) error("Missing end of raw directive", pos_);
      size_t p = k + 2;
      char sign = 0;
      if (p < n_ && (s_[p] == '-' || s_[p] == '+')) sign = s_[p++];
      p = skip_ws(p);
      if (starts(p, "endraw")) {
        p = skip_ws(p + 6);
        size_t end = 0;
        if (starts(p, "+%}")) {
          end = p + 3;
        } else if (starts(p, "-%}")) {
          end = skip_ws(p + 3);
        } else if (starts(p, "%}")) {
          end = p + 2;
          if (end < n_ && s_[end] == '\n') ++end;
        }
        if (end != 0) {
          const std::string_view text = strip_before(s_.substr(pos_, k - pos_), sign, false);
          if (!text.empty()) emit(Tok::kData, std::string(text), pos_);
          line_starting_ = s_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      ++k;
    }
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }
  // (\d+_)*\d+ from p: its end, or npos.
  size_t digits_us(size_t p) const {
    if (p >= n_ || !digit(s_[p])) return std::string_view::npos;
    while (true) {
      while (p < n_ && digit(s_[p])) ++p;
      if (p + 1 < n_ && s_[p] == '_' && digit(s_[p + 1])) {
        ++p;
        continue;
      }
      return p;
    }
  }
  size_t match_float(size_t p) const {
    if (p > 0 && s_[p - 1] == '.') return 0;
    const size_t q = digits_us(p);
    if (q == std::string_view::npos) return 0;
    size_t frac = std::string_view::npos;
    if (q < n_ && s_[q] == '.') frac = digits_us(q + 1);
    for (const size_t r : {frac, q}) {  // (\.digits)? e[+-]?digits
      if (r == std::string_view::npos || r >= n_ || (s_[r] != 'e' && s_[r] != 'E')) continue;
      size_t e = r + 1;
      if (e < n_ && (s_[e] == '+' || s_[e] == '-')) ++e;
      const size_t end = digits_us(e);
      if (end != std::string_view::npos) return end - p;
    }
    if (frac != std::string_view::npos) return frac - p;
    return 0;
  }
  size_t match_int(size_t p, int& base) const {
    auto prefixed = [&](char lo, char up, auto ok) -> size_t {
      if (p + 1 < n_ && s_[p] == '0' && (s_[p + 1] == lo || s_[p + 1] == up)) {
        size_t q = p + 2, count = 0;
        while (true) {
          if (q + 1 < n_ && s_[q] == '_' && ok(s_[q + 1])) {
            q += 2;
          } else if (q < n_ && ok(s_[q])) {
            ++q;
          } else {
            break;
          }
          ++count;
        }
        if (count > 0) return q - p;
      }
      return 0;
    };
    size_t len;
    if ((len = prefixed('b', 'B', [](char c) { return c == '0' || c == '1'; }))) {
      base = 2;
      return len;
    }
    if ((len = prefixed('o', 'O', [](char c) { return c >= '0' && c <= '7'; }))) {
      base = 8;
      return len;
    }
    if ((len = prefixed('x', 'X', [](char c) {
           return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         }))) {
      base = 16;
      return len;
    }
    base = 10;
    if (p < n_ && s_[p] >= '1' && s_[p] <= '9') {
      size_t q = p + 1;
      while (true) {
        if (q + 1 < n_ && s_[q] == '_' && digit(s_[q + 1])) {
          q += 2;
        } else if (q < n_ && digit(s_[q])) {
          ++q;
        } else {
          return q - p;
        }
      }
    }
    if (p < n_ && s_[p] == '0') {
      size_t q = p + 1;
      while (true) {
        if (q + 1 < n_ && s_[q] == '_' && s_[q + 1] == '0') {
          q += 2;
        } else if (q < n_ && s_[q] == '0') {
          ++q;
        } else {
          return q - p;
        }
      }
    }
    return 0;
  }
  bool name_char(uint32_t c, bool first) const {
    if (c < 0x80) return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && digit(static_cast<char>(c)));
    return unicode::is_word(c);
  }

  std::string decode_string(size_t begin, size_t end) {
    // Python's unicode-escape over the text with non-ASCII written as \x.. \u.. \U.. first
    // (what jinja2 does), so a backslash before a non-ASCII character keeps that spelling.
    std::string out;
    size_t i = begin;
    auto hex = [&](size_t at, int count, const char* what) -> uint32_t {
      uint32_t v = 0;
      for (int k = 0; k < count; ++k) {
        const size_t p = at + static_cast<size_t>(k);
        const char c = p < end ? s_[p] : '\0';
        int d;
        if (digit(c)) {
          d = c - '0';
        } else if (c >= 'a' && c <= 'f') {
          d = c - 'a' + 10;
        } else if (c >= 'A' && c <= 'F') {
          d = c - 'A' + 10;
        } else {
          error(std::string("truncated ") + what + " escape", begin);
        }
        v = v * 16 + static_cast<uint32_t>(d);
      }
      return v;
    };
    auto put = [&](uint32_t cp) {
      if (cp > 0x10FFFF) error("illegal Unicode character", begin);
      if (cp >= 0xD800 && cp <= 0xDFFF) error("a lone surrogate in a string literal is not supported", begin);
      unicode::append_utf8(out, cp);
    };
    while (i < end) {
      const char c = s_[i];
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= end) error("\\ at end of string", begin);
      const char e = s_[i + 1];
      const auto ue = static_cast<unsigned char>(e);
      i += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': put(hex(i, 2, "\\xXX")); i += 2; break;
        case 'u': put(hex(i, 4, "\\uXXXX")); i += 4; break;
        case 'U': put(hex(i, 8, "\\UXXXXXXXX")); i += 8; break;
        case 'N': error("\\N{...} escapes are not supported", begin);
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < end && s_[i] >= '0' && s_[i] <= '7'; ++k) v = v * 8 + static_cast<uint32_t>(s_[i++] - '0');
            put(v);
          } else if (ue >= 0x80) {
            // "\é" is "\\xe9" after backslashreplace: a backslash, then "xe9".
            size_t j = i - 1;
            const uint32_t cp = unicode::next_cp(s_, j);
            char buf[16];
            if (cp <= 0xFF) {
              std::snprintf(buf, sizeof buf, "\\x%02x", cp);
            } else if (cp <= 0xFFFF) {
              std::snprintf(buf, sizeof buf, "\\u%04x", cp);
            } else {
              std::snprintf(buf, sizeof buf, "\\U%08x", cp);
            }
            out += buf;
            i = j;
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }

  void tag(bool variable, size_t begin) {
    while (pos_ < n_) {
      if (balance_.empty()) {
        if (variable) {
          if (starts(pos_, "-}}")) {
            emit(Tok::kVarEnd, "", pos_);
            pos_ = skip_ws(pos_ + 3);
            line_starting_ = s_[pos_ - 1] == '\n';
            return;
          }
          if (starts(pos_, "}}")) {
            emit(Tok::kVarEnd, "", pos_);
            pos_ += 2;
            line_starting_ = false;
            return;
          }
        } else {
          if (starts(pos_, "+%}")) {
            emit(Tok::kBlockEnd, "", pos_);
            pos_ += 3;
            line_starting_ = false;
            return;
          }
          if (starts(pos_, "-%}")) {
            emit(Tok::kBlockEnd, "", pos_);
            pos_ = skip_ws(pos_ + 3);
            line_starting_ = s_[pos_ - 1] == '\n';
            return;
          }
          if (starts(pos_, "%}")) {
            emit(Tok::kBlockEnd, "", pos_);
            pos_ += 2;
            if (pos_ < n_ && s_[pos_] == '\n') ++pos_;  // trim_blocks
            line_starting_ = s_[pos_ - 1] == '\n';
            return;
          }
        }
      }
      size_t next;
      const uint32_t c = cp_at(pos_, &next);
      if (unicode::is_space(c)) {
        pos_ = skip_ws(pos_);
        continue;
      }
      if (const size_t len = match_float(pos_)) {
        std::string t;
        for (size_t k = pos_; k < pos_ + len; ++k) {
          if (s_[k] != '_') t += s_[k];
        }
        emit(Tok::kFloat, t, pos_, Value(std::strtod(t.c_str(), nullptr)));
        pos_ += len;
        continue;
      }
      int base = 10;
      if (const size_t len = match_int(pos_, base)) {
        uint64_t v = 0;
        const size_t from = pos_ + (base == 10 ? 0 : 2);
        for (size_t k = from; k < pos_ + len; ++k) {
          const char d = s_[k];
          if (d == '_') continue;
          const int dv = digit(d) ? d - '0' : (d | 0x20) - 'a' + 10;
          if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - static_cast<uint64_t>(dv)) / static_cast<uint64_t>(base)) {
            error("integer literal too large (this engine's integers are 64-bit)", pos_);
          }
          v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(dv);
        }
        emit(Tok::kInt, std::string(s_.substr(pos_, len)), pos_, Value(static_cast<int64_t>(v)));
        pos_ += len;
        continue;
      }
      if (name_char(c, true)) {
        size_t q = next;
        while (q < n_) {
          size_t r;
          if (!name_char(cp_at(q, &r), false)) break;
          q = r;
        }
        emit(Tok::kName, std::string(s_.substr(pos_, q - pos_)), pos_);
        pos_ = q;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t q = pos_ + 1;
        bool closed = false;
        while (q < n_) {
          if (s_[q] == '\\') {
            q += 2;
            continue;
          }
          if (s_[q] == static_cast<char>(c)) {
            closed = true;
            break;
          }
          ++q;
        }
        if (closed) {
          emit(Tok::kString, decode_string(pos_ + 1, q), pos_);
          pos_ = q + 1;
          continue;
        }
      }
      static const char* const kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* o : kOps2) {
        if (starts(pos_, o)) op = o;
      }
      if (op.empty() && c < 0x80 && std::strchr("+-/*%~[](){}><=.:|,;", static_cast<int>(c)) != nullptr) {
        op = std::string(1, static_cast<char>(c));
      }
      if (op.empty()) {
        std::string ch;
        append_str_repr(ch, s_.substr(pos_, next - pos_));
        error("unexpected char " + ch + " at " + std::to_string(unicode::count_cps(s_.substr(0, pos_))), pos_);
      }
      if (op == "{" || op == "(" || op == "[") {
        balance_.push_back(op == "{" ? '}' : op == "(" ? ')' : ']');
      } else if (op == "}" || op == ")" || op == "]") {
        if (balance_.empty()) error("unexpected '" + op + "'", pos_);
        const char want = balance_.back();
        balance_.pop_back();
        if (want != op[0]) error("unexpected '" + op + "', expected '" + std::string(1, want) + "'", pos_);
      }
      emit(Tok::kOp, op, pos_);
      pos_ += op.size();
    }
    (void)begin;
  }
};

// ---- parser ----

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::kName:
    case Tok::kOp: return t.text;
    case Tok::kData: return "template data / text";
    case Tok::kVarBegin: return "begin of print statement";
    case Tok::kVarEnd: return "end of print statement";
    case Tok::kBlockBegin: return "begin of statement block";
    case Tok::kBlockEnd: return "end of statement block";
    case Tok::kString: return "string";
    case Tok::kInt: return "integer";
    case Tok::kFloat: return "float";
    case Tok::kEof: return "end of template";
  }
  return "?";
}

class Parser {
 public:
  Parser(std::vector<Token> toks, const ChatTemplateLimits& lim) : t_(std::move(toks)), lim_(lim) {}

  Body parse() {
    Body b = subparse({});
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;
  const ChatTemplateLimits& lim_;
  int depth_ = 0;
  int loops_ = 0;  // loops around the current statement (break/continue), reset in macros
  std::vector<std::string> tag_stack_;
  std::vector<std::vector<std::string>> end_stack_;

  struct Guard {
    Parser& p;
    explicit Guard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.lim_.max_nesting) {
        throw RenderError{Kind::kLimit, "the template nests deeper than " + std::to_string(p.lim_.max_nesting) + " levels",
                          p.cur().pos.line, p.cur().pos.col};
      }
    }
    ~Guard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_name(const char* v) const { return cur().type == Tok::kName && cur().text == v; }
  bool is_op(const char* v) const { return cur().type == Tok::kOp && cur().text == v; }
  bool skip_name(const char* v) {
    if (!is_name(v)) return false;
    next();
    return true;
  }
  bool skip_op(const char* v) {
    if (!is_op(v)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail_here(const std::string& msg) { syntax_error(msg, cur().pos); }
  [[noreturn]] void fail_expected(const std::string& what) {
    if (cur().type == Tok::kEof) fail_eof(what);
    fail_here("expected token '" + what + "', got '" + describe(cur()) + "'");
  }
  [[noreturn]] void fail_eof(const std::string& what) {
    std::string msg = "unexpected end of template, expected '" + what + "'.";
    if (!tag_stack_.empty()) msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
    fail_here(msg);
  }
  const Token& expect_op(const char* op) {
    if (!is_op(op)) fail_expected(op);
    return next();
  }
  const Token& expect_name() {
    if (cur().type != Tok::kName) fail_expected("name");
    return next();
  }
  const Token& expect_name(const char* v) {
    if (!is_name(v)) fail_expected(v);
    return next();
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail_expected(what);
    next();
  }

  ExprP mk(ExprKind k, Pos p) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = p;
    return e;
  }
  // Bounds the tree's depth: binary chains (1+1+1...) and filter chains are loops in the
  // parser, so the depth is counted on the tree itself.
  ExprP done(ExprP e) {
    int d = 0;
    for (const auto& a : e->args) {
      if (a) d = std::max(d, a->depth);
    }
    for (const auto& kv : e->kwargs) d = std::max(d, kv.second->depth);
    if (e->dyn_args) d = std::max(d, e->dyn_args->depth);
    if (e->dyn_kwargs) d = std::max(d, e->dyn_kwargs->depth);
    e->depth = d + 1;
    if (e->depth > 4 * lim_.max_nesting) {
      throw RenderError{Kind::kLimit,
                        "an expression nests deeper than " + std::to_string(4 * lim_.max_nesting) + " levels",
                        e->pos.line, e->pos.col};
    }
    return e;
  }

  // -- statements --

  bool at_end_token(const std::vector<std::string>& ends) const {
    if (cur().type != Tok::kName) return false;
    return std::find(ends.begin(), ends.end(), cur().text) != ends.end();
  }

  Body subparse(const std::vector<std::string>& ends) {
    Guard g(*this);
    Body body;
    if (!ends.empty()) end_stack_.push_back(ends);
    while (cur().type != Tok::kEof) {
      const Token& tok = cur();
      if (tok.type == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->pos = tok.pos;
        s->text = tok.text;
        body.push_back(std::move(s));
        next();
      } else if (tok.type == Tok::kVarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->pos = cur().pos;
        s->expr = parse_tuple(false, true, {}, false, false);
        expect(Tok::kVarEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (tok.type == Tok::kBlockBegin) {
        next();
        if (!ends.empty() && at_end_token(ends)) {
          end_stack_.pop_back();
          return body;
        }
        body.push_back(parse_statement());
        expect(Tok::kBlockEnd, "end of statement block");
      } else {
        fail_here("unexpected '" + describe(tok) + "'");
      }
    }
    if (!ends.empty()) end_stack_.pop_back();
    return body;
  }

  Body parse_statements(const std::vector<std::string>& ends, bool drop_needle) {
    skip_op(":");
    expect(Tok::kBlockEnd, "end of statement block");
    Body body = subparse(ends);
    if (cur().type == Tok::kEof) {
      std::string want;
      for (size_t k = 0; k < ends.size(); ++k) want += (k ? "' or '" : "") + ends[k];
      fail_eof(want);
    }
    if (drop_needle) next();
    return body;
  }

  [[noreturn]] void fail_unknown_tag(const std::string& name) {
    std::string msg = "Encountered unknown tag '" + name + "'.";
    bool expected = false;
    for (const auto& ends : end_stack_) expected = expected || std::find(ends.begin(), ends.end(), name) != ends.end();
    if (!end_stack_.empty()) {
      std::string looking;
      for (size_t k = 0; k < end_stack_.back().size(); ++k) looking += (k ? " or '" : "'") + end_stack_.back()[k] + "'";
      msg += expected ? " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " + looking + "."
                      : " Jinja was looking for the following tags: " + looking + ".";
    }
    if (!tag_stack_.empty()) msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
    fail_here(msg);
  }

  StmtP new_stmt(StmtKind k, Pos p) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->pos = p;
    return s;
  }

  StmtP parse_statement() {
    Guard g(*this);
    const Token& tok = cur();
    if (tok.type != Tok::kName) fail_here("tag name expected");
    const std::string name = tok.text;
    static const char* const kUnsupported[] = {"block", "extends", "include", "import", "from", "autoescape"};
    for (const char* u : kUnsupported) {
      if (name == u) {
        fail_here("the '" + name + "' tag is not supported (a chat template renders alone, without other templates)");
      }
    }
    tag_stack_.push_back(name);
    StmtP s;
    if (name == "for") {
      s = parse_for();
    } else if (name == "if") {
      s = parse_if();
    } else if (name == "set") {
      s = parse_set();
    } else if (name == "macro") {
      s = parse_macro();
    } else if (name == "call") {
      s = parse_call_block();
    } else if (name == "filter") {
      s = parse_filter_block();
    } else if (name == "with") {
      s = parse_with();
    } else if (name == "print") {
      s = parse_print();
    } else if (name == "break" || name == "continue") {
      if (loops_ == 0) fail_here("'" + name + "' outside loop");
      s = new_stmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, next().pos);
    } else if (name == "generation") {  // transformers' AssistantTracker extension
      s = new_stmt(StmtKind::kBlock, next().pos);
      s->body = parse_statements({"endgeneration"}, true);
    } else {
      tag_stack_.pop_back();
      fail_unknown_tag(name);
    }
    tag_stack_.pop_back();
    return s;
  }

  void check_target(const Expr& e, bool allow_ns) {
    if (e.kind == ExprKind::kName) return;
    if (e.kind == ExprKind::kNsRef && allow_ns) return;
    if (e.kind == ExprKind::kTuple) {
      for (const auto& a : e.args) check_target(*a, allow_ns);
      return;
    }
    std::string what = e.kind == ExprKind::kConst ? "const" : e.kind == ExprKind::kList ? "list" : e.kind == ExprKind::kDict ? "dict" : "expression";
    syntax_error("can't assign to '" + what + "'", e.pos);
  }

  ExprP parse_assign_target(const std::vector<std::string>& extra_end, bool with_namespace) {
    ExprP t = parse_tuple(true, true, extra_end, false, with_namespace);
    check_target(*t, with_namespace);
    return t;
  }

  StmtP parse_for() {
    auto s = new_stmt(StmtKind::kFor, expect_name("for").pos);
    s->target = parse_assign_target({"in"}, false);
    expect_name("in");
    s->expr = parse_tuple(false, false, {"recursive"}, false, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail_here("recursive loops are not supported");
    ++loops_;
    s->body = parse_statements({"endfor", "else"}, false);
    --loops_;
    if (next().text == "else") s->else_body = parse_statements({"endfor"}, true);
    return s;
  }

  StmtP parse_if() {
    auto s = new_stmt(StmtKind::kIf, expect_name("if").pos);
    s->expr = parse_tuple(false, false, {}, false, false);
    s->body = parse_statements({"elif", "else", "endif"}, false);
    while (true) {
      const Token& t = next();
      if (t.text == "elif") {
        ExprP cond = parse_tuple(false, false, {}, false, false);
        s->elifs.emplace_back(std::move(cond), parse_statements({"elif", "else", "endif"}, false));
        continue;
      }
      if (t.text == "else") s->else_body = parse_statements({"endif"}, true);
      return s;
    }
  }

  StmtP parse_set() {
    const Pos p = next().pos;
    ExprP target = parse_assign_target({}, true);
    if (skip_op("=")) {
      auto s = new_stmt(StmtKind::kSet, p);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {}, false, false);
      return s;
    }
    auto s = new_stmt(StmtKind::kSetBlock, p);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter(nullptr, false);
    s->body = parse_statements({"endset"}, true);
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      s.params.push_back(expect_name().text);
      if (skip_op("=")) {
        s.defaults.push_back(parse_expression(true));
      } else if (!s.defaults.empty()) {
        fail_here("non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  static void scan_names(const Expr* e, Stmt& s) {
    if (e == nullptr) return;
    if (e->kind == ExprKind::kName) {
      s.uses_caller = s.uses_caller || e->name == "caller";
      s.uses_varargs = s.uses_varargs || e->name == "varargs";
      s.uses_kwargs = s.uses_kwargs || e->name == "kwargs";
    }
    for (const auto& a : e->args) scan_names(a.get(), s);
    for (const auto& kv : e->kwargs) scan_names(kv.second.get(), s);
    scan_names(e->dyn_args.get(), s);
    scan_names(e->dyn_kwargs.get(), s);
  }
  static void scan_body(const Body& b, Stmt& s) {
    for (const auto& st : b) {
      scan_names(st->expr.get(), s);
      scan_names(st->cond.get(), s);
      scan_names(st->filter.get(), s);
      for (const auto& d : st->defaults) scan_names(d.get(), s);
      for (const auto& v : st->values) scan_names(v.get(), s);
      scan_body(st->body, s);
      scan_body(st->else_body, s);
      for (const auto& [c, b] : st->elifs) {
        scan_names(c.get(), s);
        scan_body(b, s);
      }
    }
  }

  StmtP parse_macro() {
    auto s = new_stmt(StmtKind::kMacro, next().pos);
    s->text = expect_name().text;
    parse_signature(*s);
    const int loops = loops_;
    loops_ = 0;
    s->body = parse_statements({"endmacro"}, true);
    loops_ = loops;
    scan_body(s->body, *s);
    return s;
  }

  StmtP parse_call_block() {
    auto s = new_stmt(StmtKind::kCallBlock, next().pos);
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::kCall) syntax_error("expected call", s->pos);
    const int loops = loops_;
    loops_ = 0;
    s->body = parse_statements({"endcall"}, true);
    loops_ = loops;
    scan_body(s->body, *s);
    return s;
  }

  StmtP parse_filter_block() {
    auto s = new_stmt(StmtKind::kFilterBlock, next().pos);
    s->filter = parse_filter(nullptr, true);
    s->body = parse_statements({"endfilter"}, true);
    return s;
  }

  StmtP parse_with() {
    auto s = new_stmt(StmtKind::kWith, next().pos);
    while (cur().type != Tok::kBlockEnd) {
      if (!s->params.empty()) expect_op(",");
      const Token& name = expect_name();
      s->params.push_back(name.text);
      expect_op("=");
      s->values.push_back(parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true);
    return s;
  }

  StmtP parse_print() {
    auto s = new_stmt(StmtKind::kBlock, next().pos);
    bool first = true;
    while (cur().type != Tok::kBlockEnd) {
      if (!first) expect_op(",");
      first = false;
      auto p = new_stmt(StmtKind::kPrint, cur().pos);
      p->expr = parse_expression(true);
      s->body.push_back(std::move(p));
    }
    return s;
  }

  // -- expressions --

  bool is_tuple_end(const std::vector<std::string>& extra) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")")) return true;
    return at_end_token(extra);
  }

  ExprP parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra, bool explicit_parens,
                    bool with_namespace) {
    const Pos p = cur().pos;
    std::vector<ExprP> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra)) break;
      args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail_here("Expected an expression, got '" + describe(cur()) + "'");
    }
    auto e = mk(ExprKind::kTuple, p);
    e->args = std::move(args);
    return done(std::move(e));
  }

  ExprP parse_expression(bool with_condexpr) {
    Guard g(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprP parse_condexpr() {
    const Pos p = cur().pos;
    ExprP e = parse_or();
    while (skip_name("if")) {
      ExprP test = parse_or();
      ExprP other;
      if (skip_name("else")) {
        Guard g(*this);
        other = parse_condexpr();
      }
      auto c = mk(ExprKind::kCond, p);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(other));
      e = done(std::move(c));
    }
    return e;
  }

  ExprP binary(ExprKind k, ExprP l, ExprP r, Pos p) {
    auto e = mk(k, p);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return done(std::move(e));
  }

  ExprP parse_or() {
    const Pos p = cur().pos;
    ExprP l = parse_and();
    while (skip_name("or")) l = binary(ExprKind::kOr, std::move(l), parse_and(), p);
    return l;
  }
  ExprP parse_and() {
    const Pos p = cur().pos;
    ExprP l = parse_not();
    while (skip_name("and")) l = binary(ExprKind::kAnd, std::move(l), parse_not(), p);
    return l;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      Guard g(*this);
      const Pos p = next().pos;
      auto e = mk(ExprKind::kNot, p);
      e->args.push_back(parse_not());
      return done(std::move(e));
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    const Pos p = cur().pos;
    ExprP first = parse_math1();
    ExprP e;
    while (true) {
      CmpKind k;
      if (is_op("==")) {
        k = CmpKind::kEq;
      } else if (is_op("!=")) {
        k = CmpKind::kNe;
      } else if (is_op("<")) {
        k = CmpKind::kLt;
      } else if (is_op("<=")) {
        k = CmpKind::kLe;
      } else if (is_op(">")) {
        k = CmpKind::kGt;
      } else if (is_op(">=")) {
        k = CmpKind::kGe;
      } else if (is_name("in")) {
        k = CmpKind::kIn;
      } else if (is_name("not") && look().type == Tok::kName && look().text == "in") {
        next();
        k = CmpKind::kNotIn;
      } else {
        break;
      }
      next();
      if (!e) {
        e = mk(ExprKind::kCompare, p);
        e->args.push_back(std::move(first));
      }
      e->cmps.push_back(k);
      e->args.push_back(parse_math1());
    }
    return e ? done(std::move(e)) : std::move(first);
  }
  ExprP parse_math1() {
    const Pos p = cur().pos;
    ExprP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const BinOp op = next().text == "+" ? BinOp::kAdd : BinOp::kSub;
      l = binary(ExprKind::kBinary, std::move(l), parse_concat(), p);
      l->op = op;
    }
    return l;
  }
  ExprP parse_concat() {
    const Pos p = cur().pos;
    ExprP first = parse_math2();
    if (!is_op("~")) return first;
    auto e = mk(ExprKind::kConcat, p);
    e->args.push_back(std::move(first));
    while (skip_op("~")) e->args.push_back(parse_math2());
    return done(std::move(e));
  }
  ExprP parse_math2() {
    const Pos p = cur().pos;
    ExprP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string o = next().text;
      const BinOp op = o == "*" ? BinOp::kMul : o == "/" ? BinOp::kDiv : o == "//" ? BinOp::kFloorDiv : BinOp::kMod;
      l = binary(ExprKind::kBinary, std::move(l), parse_pow(), p);
      l->op = op;
    }
    return l;
  }
  ExprP parse_pow() {
    const Pos p = cur().pos;
    ExprP l = parse_unary(true);
    while (skip_op("**")) {
      l = binary(ExprKind::kBinary, std::move(l), parse_unary(true), p);
      l->op = BinOp::kPow;
    }
    return l;
  }
  ExprP parse_unary(bool with_filter) {
    Guard g(*this);
    const Pos p = cur().pos;
    ExprP node;
    if (is_op("-") || is_op("+")) {
      const bool neg = next().text == "-";
      node = mk(neg ? ExprKind::kNeg : ExprKind::kPos, p);
      node->args.push_back(parse_unary(false));
      node = done(std::move(node));
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }
  ExprP parse_primary(bool with_namespace) {
    const Token& tok = cur();
    const Pos p = tok.pos;
    if (tok.type == Tok::kName) {
      const std::string name = next().text;
      if (name == "true" || name == "True" || name == "false" || name == "False") {
        auto e = mk(ExprKind::kConst, p);
        e->value = Value(name == "true" || name == "True");
        return e;
      }
      if (name == "none" || name == "None") return mk(ExprKind::kConst, p);
      if (with_namespace && is_op(".")) {
        next();
        auto e = mk(ExprKind::kNsRef, p);
        e->name = name;
        e->attr = expect_name().text;
        return e;
      }
      auto e = mk(ExprKind::kName, p);
      e->name = name;
      return e;
    }
    if (tok.type == Tok::kString) {
      std::string s = next().text;
      while (cur().type == Tok::kString) s += next().text;
      auto e = mk(ExprKind::kConst, p);
      e->value = Value(std::move(s));
      return e;
    }
    if (tok.type == Tok::kInt || tok.type == Tok::kFloat) {
      auto e = mk(ExprKind::kConst, p);
      e->value = next().num;
      return e;
    }
    if (is_op("(")) {
      next();
      ExprP e = parse_tuple(false, true, {}, true, false);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = mk(ExprKind::kList, p);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      expect_op("]");
      return done(std::move(e));
    }
    if (is_op("{")) {
      next();
      auto e = mk(ExprKind::kDict, p);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      expect_op("}");
      return done(std::move(e));
    }
    if (tok.type == Tok::kEof) fail_eof("expression");
    fail_here("unexpected '" + describe(tok) + "'");
  }
  ExprP parse_postfix(ExprP node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }
  ExprP parse_filter_expr(ExprP node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }
  // Postfix nodes take their object's position, so an error in `messages[0].content` or
  // `raise_exception(...)` points at the start of the expression.
  ExprP parse_subscript(ExprP node) {
    const Token& tok = next();
    const Pos p = node->pos;
    if (tok.text == ".") {
      const Token& a = cur();
      if (a.type == Tok::kName) {
        auto e = mk(ExprKind::kGetattr, p);
        e->name = next().text;
        e->args.push_back(std::move(node));
        return done(std::move(e));
      }
      if (a.type != Tok::kInt) fail_here("expected name or number");
      auto key = mk(ExprKind::kConst, a.pos);
      key->value = next().num;
      auto e = mk(ExprKind::kGetitem, p);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(key));
      return done(std::move(e));
    }
    std::vector<ExprP> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = mk(ExprKind::kGetitem, p);
    e->args.push_back(std::move(node));
    if (args.size() == 1) {
      e->args.push_back(std::move(args[0]));
    } else {
      auto t = mk(ExprKind::kTuple, p);
      t->args = std::move(args);
      e->args.push_back(done(std::move(t)));
    }
    return done(std::move(e));
  }
  ExprP parse_subscribed() {
    const Pos p = cur().pos;
    std::vector<ExprP> args;
    if (is_op(":")) {
      next();
      args.emplace_back();
    } else {
      ExprP node = parse_expression(true);
      if (!is_op(":")) return node;
      next();
      args.push_back(std::move(node));
    }
    if (is_op(":")) {
      args.emplace_back();
    } else if (!is_op("]") && !is_op(",")) {
      args.push_back(parse_expression(true));
    } else {
      args.emplace_back();
    }
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(",")) {
        args.push_back(parse_expression(true));
      } else {
        args.emplace_back();
      }
    } else {
      args.emplace_back();
    }
    auto e = mk(ExprKind::kSlice, p);
    e->args = std::move(args);
    return done(std::move(e));
  }
  void parse_call_args(Expr& e) {
    const Pos p = expect_op("(").pos;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) syntax_error("invalid syntax for function call expression", p);
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!e.dyn_args && !e.dyn_kwargs);
        next();
        e.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!e.dyn_kwargs);
        next();
        e.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::kName && look().type == Tok::kOp && look().text == "=") {
        ensure(!e.dyn_kwargs);
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!e.dyn_args && !e.dyn_kwargs && e.kwargs.empty());
        e.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }
  ExprP parse_call(ExprP node) {
    auto e = mk(ExprKind::kCall, node->pos);
    e->args.push_back(std::move(node));
    parse_call_args(*e);
    return done(std::move(e));
  }
  ExprP parse_filter(ExprP node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      const Token& tok = expect_name();
      auto e = mk(ExprKind::kFilter, tok.pos);
      e->name = tok.text;
      while (skip_op(".")) e->name += "." + expect_name().text;
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = done(std::move(e));
      start_inline = false;
    }
    return node;
  }
  ExprP parse_test(ExprP node) {
    const Pos p = next().pos;
    const bool negated = skip_name("not");
    auto e = mk(ExprKind::kTest, p);
    e->name = expect_name().text;
    while (skip_op(".")) e->name += "." + expect_name().text;
    e->args.push_back(std::move(node));
    const Tok t = cur().type;
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t == Tok::kName || t == Tok::kString || t == Tok::kInt || t == Tok::kFloat || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail_here("You cannot chain multiple tests with is");
      ExprP arg = parse_primary(false);
      e->args.push_back(parse_postfix(std::move(arg)));
    }
    ExprP test = done(std::move(e));
    if (!negated) return test;
    auto n = mk(ExprKind::kNot, p);
    n->args.push_back(std::move(test));
    return done(std::move(n));
  }
};

// Unknown filters and tests: an error when parsing, except inside an if (its test and bodies)
// or an inline if, where jinja2 defers it to the moment the filter is reached.
void check_names(Expr* e, bool soft) {
  if (e == nullptr) return;
  if (e->kind == ExprKind::kCond) soft = true;
  if (e->kind == ExprKind::kFilter || e->kind == ExprKind::kTest) {
    const bool is_filter = e->kind == ExprKind::kFilter;
    e->known = is_filter ? has_filter(e->name) : has_test(e->name);
    if (!e->known && !soft) syntax_error(std::string("No ") + (is_filter ? "filter" : "test") + " named '" + e->name + "'.", e->pos);
  }
  for (auto& a : e->args) check_names(a.get(), soft);
  for (auto& kv : e->kwargs) check_names(kv.second.get(), soft);
  check_names(e->dyn_args.get(), soft);
  check_names(e->dyn_kwargs.get(), soft);
}

void check_names(Body& body, bool soft) {
  for (auto& s : body) {
    switch (s->kind) {
      case StmtKind::kIf:
        check_names(s->expr.get(), true);
        check_names(s->body, true);
        for (auto& [c, b] : s->elifs) {
          check_names(c.get(), true);
          check_names(b, true);
        }
        check_names(s->else_body, true);
        break;
      case StmtKind::kFor:
        check_names(s->expr.get(), soft);
        check_names(s->cond.get(), false);
        check_names(s->body, false);
        check_names(s->else_body, false);
        break;
      case StmtKind::kPrint:
      case StmtKind::kSet:
      case StmtKind::kCallBlock:
        check_names(s->expr.get(), soft);
        check_names(s->body, false);
        break;
      case StmtKind::kBlock:
        check_names(s->body, soft);
        break;
      default:
        check_names(s->expr.get(), false);
        check_names(s->filter.get(), false);
        for (auto& d : s->defaults) check_names(d.get(), false);
        for (auto& v : s->values) check_names(v.get(), false);
        check_names(s->body, false);
        check_names(s->else_body, false);
    }
  }
}

}  // namespace

std::unique_ptr<Program> parse_program(std::string_view source, std::string name, const ChatTemplateLimits& limits) {
  if (source.size() > limits.max_source_bytes) {
    throw RenderError{Kind::kLimit, "the template is longer than " + std::to_string(limits.max_source_bytes) + " bytes", 0, 0};
  }
  if (const size_t bad = unicode::invalid_utf8_at(source); bad != std::string_view::npos) {
    throw RenderError{Kind::kSyntax, "the template is not valid UTF-8 (byte offset " + std::to_string(bad) + ")", 0, 0};
  }
  // jinja2's lexer: \r\n and \r become \n; one trailing newline is dropped.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  auto prog = std::make_unique<Program>();
  prog->name = std::move(name);
  prog->limits = limits;
  Parser parser(Lexer(src).run(), limits);
  prog->body = parser.parse();
  check_names(prog->body, false);
  return prog;
}

}  // namespace diffattn::tokenize::jinja
