// The pushdown automaton of a compiled schema (program.h): one byte at a time, every parse
// (head) still alive takes it or dies. A head is a stack of frames, one per value being read;
// a value that may start several ways (anyOf, type lists) forks the head, one per way its first
// byte allows. Invariant (liveness): every state a head reaches can still be finished, because a
// byte is taken only when what it starts can be completed (feasible depth, a key that can still
// name an allowed property, an integer prefix with a completion in range, ...).
#include <algorithm>

#include "diffattn/grammar/json_schema.h"
#include "grammar/program.h"

namespace diffattn::grammar::detail {

bool Program::feasible(uint32_t node, uint32_t depth) const {
  return depth + nodes[node].min_depth <= static_cast<uint32_t>(kMaxDocumentDepth);
}

namespace {

enum RootPhase : uint8_t { kRootStart, kRootValue, kRootDone };
enum ObjectPhase : uint8_t {
  kObjOpen,              // after '{': a name or '}'
  kObjKey,               // a name is being read (a kKey frame above)
  kObjColon,             // after a name: ':'
  kObjAfterColon,        // ' ' or the value
  kObjAfterColonSpace,   // the value
  kObjValue,             // a value is being read (a frame above)
  kObjAfterValue,        // ',' or '}'
  kObjAfterComma,        // ' ' or a name
  kObjAfterCommaSpace,   // a name
};
enum ArrayPhase : uint8_t { kArrOpen, kArrItem, kArrAfterItem, kArrAfterComma, kArrAfterCommaSpace };
// Strings and names share the lexer's phases.
enum StringPhase : uint8_t {
  kStrNormal,        // between characters
  kStrEscape,        // after '\'
  kStrHex,           // in \uXXXX, sub digits read, v their value
  kStrLowBackslash,  // after a high surrogate's escape: '\' of the low one
  kStrLowU,          // 'u' of the low one
  kStrLowHex,        // its digits (DC00-DFFF)
  kStrUtf8,          // inside a multi-byte character: sub bytes left, b = lo | hi << 8 next
};
enum NumberPhase : uint8_t { kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

enum class Result { kTaken, kTakenDone, kNotMine, kFail };

int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

// The first byte of a multi-byte UTF-8 character (RFC 3629's table: no overlong forms, no
// surrogates, nothing above U+10FFFF): how many bytes follow and the range of the next one.
bool utf8_lead(Frame& f, uint8_t c) {
  uint32_t left, lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    left = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    left = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    left = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return false;
  }
  f.phase = kStrUtf8;
  f.sub = static_cast<uint8_t>(left);
  f.b = lo | hi << 8;
  return true;
}

bool utf8_continue(Frame& f, uint8_t c) {
  if (c < (f.b & 0xff) || c > (f.b >> 8)) return false;
  if (--f.sub == 0) {
    f.phase = kStrNormal;
    f.b = 0;
  } else {
    f.b = 0x80 | 0xBF << 8;
  }
  return true;
}

// Whether an integer that starts with these digits can still end in [lo, hi] with at most
// kMaxIntegerDigits digits. digits == 0: only the '-' so far (so "-0" or a negative number).
bool integer_viable(const NumberSpec& s, bool neg, uint64_t mag, uint32_t digits) {
  if (!s.ranged) return true;
  using i128 = __int128;
  const auto hits = [&](i128 lo, i128 hi) {  // [lo, hi] of magnitudes, signed by neg
    if (neg) std::swap(lo, hi), lo = -lo, hi = -hi;
    return lo <= s.hi && hi >= s.lo;
  };
  i128 p10 = 1;
  for (int j = 0; j < kMaxIntegerDigits; ++j) p10 *= 10;
  if (digits == 0) return hits(0, p10 - 1);
  if (mag == 0) return hits(0, 0);  // a leading zero ends the digits
  i128 scale = 1;
  for (uint32_t j = 0; digits + j <= static_cast<uint32_t>(kMaxIntegerDigits); ++j, scale *= 10) {
    const i128 lo = static_cast<i128>(mag) * scale;
    if (hits(lo, lo + scale - 1)) return true;
  }
  return false;
}

bool integer_in_range(const NumberSpec& s, const Frame& f) {
  if (!s.ranged) return true;
  const __int128 v = (f.sub & 1) ? -static_cast<__int128>(f.v) : static_cast<__int128>(f.v);
  return v >= s.lo && v <= s.hi;
}

class Stepper {
 public:
  Stepper(const Program& p, State& out) : p_(p), out_(out) {}

  // Feeds c to head h of out_ (a copy of an input head); false when the head dies. Forks made
  // on the way are new heads of out_, already fed.
  bool run(size_t h, uint8_t c) {
    for (;;) {
      Stack& st = out_.heads[h];
      Result r;
      switch (st.back().kind) {
        case FrameKind::kRoot: r = root(h, c); break;
        case FrameKind::kObject: r = object(h, c); break;
        case FrameKind::kKey: r = key(out_.heads[h], c); break;
        case FrameKind::kArray: r = array(h, c); break;
        case FrameKind::kString: r = string(st.back(), c); break;
        case FrameKind::kNumber: r = number(st.back(), c); break;
        case FrameKind::kLiteral: r = literal(st.back(), c); break;
        default: r = Result::kFail;
      }
      if (r == Result::kTaken) return true;
      if (r == Result::kFail) return false;
      Stack& s = out_.heads[h];
      s.pop_back();
      child_done(s);
      if (r == Result::kTakenDone) return true;
      // kNotMine: the finished value leaves c to its parent.
    }
  }

  size_t new_head() {
    if (out_.n == out_.heads.size()) out_.heads.emplace_back();
    return out_.n++;
  }

 private:
  const ObjectSpec& spec_of(const Frame& f) const { return p_.objects[p_.nodes[f.node].index]; }

  bool extras_ok(const ObjectSpec& o, uint32_t depth) const {
    return o.additional != kNone && p_.feasible(o.additional, depth);
  }
  // Some name may follow (declared from index f.a on, or another).
  bool can_name(const ObjectSpec& o, const Frame& f) const {
    if (o.next_required[f.a] < o.props.size()) return true;
    if (f.depth + uint32_t{o.suffix_min_depth[f.a]} <= static_cast<uint32_t>(kMaxDocumentDepth)) return true;
    return extras_ok(o, f.depth);
  }
  bool no_required_left(const ObjectSpec& o, const Frame& f) const {
    return o.next_required[f.a] == o.props.size();
  }
  // Declared property k may come next in object frame f: not before f.a, not past the next
  // required one, and its value can be finished at this depth.
  bool declared_ok(const ObjectSpec& o, const Frame& f, uint32_t k) const {
    return k >= f.a && k <= o.next_required[f.a] && p_.feasible(o.props[k].value, f.depth);
  }
  // Some allowed declared name lies below key-trie node t.
  bool declared_below(const ObjectSpec& o, const Frame& f, uint32_t t) const {
    const std::vector<uint32_t>& ks = o.below[t];
    for (auto it = std::lower_bound(ks.begin(), ks.end(), f.a); it != ks.end(); ++it) {
      if (*it > o.next_required[f.a]) return false;
      if (p_.feasible(o.props[*it].value, f.depth)) return true;
    }
    return false;
  }

  void child_done(Stack& st) {
    Frame& f = st.back();
    switch (f.kind) {
      case FrameKind::kRoot: f.phase = kRootDone; break;
      case FrameKind::kObject: f.phase = f.phase == kObjKey ? kObjColon : kObjAfterValue; break;
      case FrameKind::kArray:
        f.phase = kArrAfterItem;
        if (f.a < UINT32_MAX - 1) ++f.a;
        break;
      default: break;
    }
  }

  Result root(size_t h, uint8_t c) {
    Frame& f = out_.heads[h].back();
    if (f.phase != kRootStart) return Result::kFail;
    f.phase = kRootValue;
    return start_value(h, p_.root, 0, c);
  }

  Result object(size_t h, uint8_t c) {
    Stack& st = out_.heads[h];
    Frame& f = st.back();
    const ObjectSpec& o = spec_of(f);
    switch (f.phase) {
      case kObjOpen:
      case kObjAfterValue:
        if (c == '}' && no_required_left(o, f)) return Result::kTakenDone;
        if (f.phase == kObjOpen && c == '"' && can_name(o, f)) return open_name(st);
        if (f.phase == kObjAfterValue && c == ',' && can_name(o, f)) {
          f.phase = kObjAfterComma;
          return Result::kTaken;
        }
        return Result::kFail;
      case kObjColon:
        if (c != ':') return Result::kFail;
        f.phase = kObjAfterColon;
        return Result::kTaken;
      case kObjAfterColon:
        if (c == ' ') {
          f.phase = kObjAfterColonSpace;
          return Result::kTaken;
        }
        [[fallthrough]];
      case kObjAfterColonSpace: {
        f.phase = kObjValue;
        const uint32_t target = f.b == kNone ? o.additional : o.props[f.b].value;
        return start_value(h, target, f.depth, c);
      }
      case kObjAfterComma:
        if (c == ' ') {
          f.phase = kObjAfterCommaSpace;
          return Result::kTaken;
        }
        [[fallthrough]];
      case kObjAfterCommaSpace:
        return c == '"' ? open_name(st) : Result::kFail;
      default: return Result::kFail;
    }
  }

  Result open_name(Stack& st) {
    Frame& f = st.back();
    f.phase = kObjKey;
    Frame k;
    k.node = f.node;
    k.kind = FrameKind::kKey;
    k.phase = kStrNormal;
    k.depth = f.depth;
    k.a = 0;  // the key trie's root
    st.push_back(k);
    return Result::kTaken;
  }

  // A property name: declared names are matched through the object's key trie (k.a, kNone once
  // the text left it); other names, when allowed, through the lexer alone, with short escapes.
  Result key(Stack& st, uint8_t c) {
    Frame& k = st.back();
    Frame& obj = st[st.size() - 2];
    const ObjectSpec& o = spec_of(obj);
    switch (k.phase) {
      case kStrNormal:
        if (c == '"') {
          if (k.a != kNone && o.keys.terminal(k.a)) {
            const uint32_t prop = o.keys.payload[o.keys.nodes[k.a].first_payload];
            if (!declared_ok(o, obj, prop)) return Result::kFail;  // also not another name
            obj.b = prop;
            obj.a = prop + 1;
          } else {
            if (!extras_ok(o, obj.depth)) return Result::kFail;
            obj.b = kNone;
          }
          return Result::kTakenDone;
        }
        if (c < 0x20) return Result::kFail;
        if (c == '\\') {
          k.phase = kStrEscape;
        } else if (c >= 0x80 && !utf8_lead(k, c)) {
          return Result::kFail;
        }
        break;
      case kStrEscape:
        if (c == 'u') {
          k.phase = kStrHex;
          k.sub = 0;
          k.v = 0;
        } else if (c == '"' || c == '\\' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
          k.phase = kStrNormal;
        } else {
          return Result::kFail;
        }
        break;
      case kStrHex: {
        // \u00xx, lower case, for a control character without a short escape.
        if (k.sub < 2) {
          if (c != '0') return Result::kFail;
        } else if (k.sub == 2) {
          if (c != '0' && c != '1') return Result::kFail;
          k.v = c - '0';
        } else {
          const int h = hex_value(c);
          if (h < 0 || (c >= 'A' && c <= 'F')) return Result::kFail;
          const uint64_t code = k.v * 16 + static_cast<uint64_t>(h);
          if (code == 0x08 || code == 0x09 || code == 0x0A || code == 0x0C || code == 0x0D) return Result::kFail;
        }
        if (++k.sub == 4) {
          k.phase = kStrNormal;
          k.sub = 0;
          k.v = 0;
        }
        break;
      }
      case kStrUtf8:
        if (!utf8_continue(k, c)) return Result::kFail;
        break;
      default: return Result::kFail;
    }
    if (k.a != kNone) k.a = o.keys.child(k.a, c);
    if (k.a != kNone && declared_below(o, obj, k.a)) return Result::kTaken;
    return extras_ok(o, obj.depth) ? Result::kTaken : Result::kFail;
  }

  Result array(size_t h, uint8_t c) {
    Frame& f = out_.heads[h].back();
    const ArraySpec& a = p_.arrays[p_.nodes[f.node].index];
    const bool more = f.a < a.max_items && p_.feasible(a.items, f.depth);
    switch (f.phase) {
      case kArrOpen:
        if (c == ']' && f.a >= a.min_items) return Result::kTakenDone;
        if (!more) return Result::kFail;
        f.phase = kArrItem;
        return start_value(h, a.items, f.depth, c);
      case kArrAfterItem:
        if (c == ']' && f.a >= a.min_items) return Result::kTakenDone;
        if (c != ',' || !more) return Result::kFail;
        f.phase = kArrAfterComma;
        return Result::kTaken;
      case kArrAfterComma:
        if (c == ' ') {
          f.phase = kArrAfterCommaSpace;
          return Result::kTaken;
        }
        [[fallthrough]];
      case kArrAfterCommaSpace:
        f.phase = kArrItem;
        return start_value(h, a.items, f.depth, c);
      default: return Result::kFail;
    }
  }

  Result string(Frame& f, uint8_t c) {
    const StringSpec& s = p_.strings[p_.nodes[f.node].index];
    switch (f.phase) {
      case kStrNormal:
        if (c == '"') return f.a >= s.min_len ? Result::kTakenDone : Result::kFail;
        if (c < 0x20 || f.a >= s.max_len) return Result::kFail;
        if (c == '\\') {
          f.phase = kStrEscape;
        } else if (c >= 0x80 && !utf8_lead(f, c)) {
          return Result::kFail;
        }
        ++f.a;  // a character starts (a surrogate pair counts once: its high half)
        return Result::kTaken;
      case kStrEscape:
        if (c == 'u') {
          f.phase = kStrHex;
        } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                   c == 'r' || c == 't') {
          f.phase = kStrNormal;
        } else {
          return Result::kFail;
        }
        return Result::kTaken;
      case kStrHex:
      case kStrLowHex: {
        const int h = hex_value(c);
        if (h < 0) return Result::kFail;
        if (f.phase == kStrHex) {
          // \uDC00-\uDFFF alone would be a lone low surrogate: refuse its second digit.
          if (f.sub == 1 && f.v == 0xD && h > 0xB) return Result::kFail;
        } else if ((f.sub == 0 && h != 0xD) || (f.sub == 1 && h < 0xC)) {
          return Result::kFail;  // the low half of a pair: DC00-DFFF
        }
        f.v = f.v * 16 + static_cast<uint64_t>(h);
        if (++f.sub < 4) return Result::kTaken;
        const bool high = f.phase == kStrHex && f.v >= 0xD800 && f.v <= 0xDBFF;
        f.phase = high ? kStrLowBackslash : kStrNormal;
        f.sub = 0;
        f.v = 0;
        return Result::kTaken;
      }
      case kStrLowBackslash:
        if (c != '\\') return Result::kFail;
        f.phase = kStrLowU;
        return Result::kTaken;
      case kStrLowU:
        if (c != 'u') return Result::kFail;
        f.phase = kStrLowHex;
        return Result::kTaken;
      case kStrUtf8: return utf8_continue(f, c) ? Result::kTaken : Result::kFail;
      default: return Result::kFail;
    }
  }

  bool number_accepting(const NumberSpec& s, const Frame& f) const {
    switch (f.phase) {
      case kNumZero:
      case kNumInt: return integer_in_range(s, f);
      case kNumFrac:
      case kNumExp: return true;
      default: return false;
    }
  }

  // A digit of the integer part; false when there is no room or no completion in range.
  bool integer_digit(const NumberSpec& s, Frame& f, uint8_t c) {
    if (f.a >= static_cast<uint32_t>(kMaxIntegerDigits)) return false;
    const uint64_t mag = f.v * 10 + (c - '0');
    if (!integer_viable(s, f.sub & 1, mag, f.a + 1)) return false;
    f.v = mag;
    ++f.a;
    f.phase = mag == 0 ? kNumZero : kNumInt;
    return true;
  }

  Result number(Frame& f, uint8_t c) {
    const NumberSpec& s = p_.numbers[p_.nodes[f.node].index];
    const bool fraction_ok = !s.integer;
    switch (f.phase) {
      case kNumMinus:
        return is_digit(c) && integer_digit(s, f, c) ? Result::kTaken : Result::kFail;
      case kNumZero:
      case kNumInt:
        if (is_digit(c)) {
          if (f.phase == kNumZero) return Result::kFail;  // no leading zeros
          return integer_digit(s, f, c) ? Result::kTaken : Result::kFail;
        }
        if (fraction_ok && c == '.') {
          f.phase = kNumDot;
          return Result::kTaken;
        }
        if (fraction_ok && (c == 'e' || c == 'E')) {
          f.phase = kNumE;
          return Result::kTaken;
        }
        break;
      case kNumDot:
        if (!is_digit(c)) return Result::kFail;
        f.phase = kNumFrac;
        f.b = 1;
        return Result::kTaken;
      case kNumFrac:
        if (is_digit(c)) {
          if ((f.b & 0xff) >= static_cast<uint32_t>(kMaxFractionDigits)) return Result::kFail;
          ++f.b;
          return Result::kTaken;
        }
        if (c == 'e' || c == 'E') {
          f.phase = kNumE;
          return Result::kTaken;
        }
        break;
      case kNumE:
        if (c == '+' || c == '-') {
          f.phase = kNumESign;
          return Result::kTaken;
        }
        [[fallthrough]];
      case kNumESign:
        if (!is_digit(c)) return Result::kFail;
        f.phase = kNumExp;
        f.b = (f.b & 0xff) | 1u << 8;
        return Result::kTaken;
      case kNumExp:
        if (is_digit(c)) {
          if ((f.b >> 8) >= static_cast<uint32_t>(kMaxExponentDigits)) return Result::kFail;
          f.b += 1u << 8;
          return Result::kTaken;
        }
        break;
      default: return Result::kFail;
    }
    return number_accepting(s, f) ? Result::kNotMine : Result::kFail;
  }

  Result literal(Frame& f, uint8_t c) {
    const ByteTrie& t = p_.literals[p_.nodes[f.node].index].trie;
    const uint32_t next = t.child(f.a, c);
    if (next == kNone) return t.terminal(f.a) ? Result::kNotMine : Result::kFail;
    f.a = next;
    return t.terminal(next) && t.nodes[next].n_edges == 0 ? Result::kTakenDone : Result::kTaken;
  }

  // A value of node `target` starts with byte c inside a frame of depth `depth` (whose phase
  // already says a value is being read): one head per concrete node it may be.
  Result start_value(size_t h, uint32_t target, uint32_t depth, uint8_t c) {
    uint32_t ways[kMaxAlternatives];
    size_t n = 0;
    const Node& t = p_.nodes[target];
    const auto consider = [&](uint32_t leaf) {
      if (p_.nodes[leaf].first[c] && p_.feasible(leaf, depth)) ways[n++] = leaf;
    };
    if (t.kind == NodeKind::kAlt) {
      for (uint32_t leaf : t.leaves) consider(leaf);
    } else if (t.kind != NodeKind::kEmpty) {
      consider(target);
    }
    if (n == 0) return Result::kFail;
    for (size_t i = 1; i < n; ++i) {
      const size_t g = new_head();
      out_.heads[g] = out_.heads[h];
      if (!push_leaf(g, ways[i], depth, c)) out_.heads[g].clear();  // an empty stack: dead
    }
    return push_leaf(h, ways[0], depth, c) ? Result::kTaken : Result::kFail;
  }

  // Pushes the frame of a concrete node and gives it its first byte c.
  bool push_leaf(size_t h, uint32_t leaf, uint32_t depth, uint8_t c) {
    Stack& st = out_.heads[h];
    const Node& n = p_.nodes[leaf];
    Frame f;
    f.node = leaf;
    f.depth = static_cast<uint8_t>(depth);
    Result r = Result::kTaken;
    switch (n.kind) {
      case NodeKind::kObject:
        f.kind = FrameKind::kObject;
        f.phase = kObjOpen;
        f.depth = static_cast<uint8_t>(depth + 1);
        break;
      case NodeKind::kArray:
        f.kind = FrameKind::kArray;
        f.phase = kArrOpen;
        f.depth = static_cast<uint8_t>(depth + 1);
        break;
      case NodeKind::kString:
        f.kind = FrameKind::kString;
        f.phase = kStrNormal;
        break;
      case NodeKind::kNumber: {
        f.kind = FrameKind::kNumber;
        const NumberSpec& s = p_.numbers[n.index];
        if (c == '-') {
          f.phase = kNumMinus;
          f.sub = 1;
          if (!integer_viable(s, true, 0, 0)) return false;
        } else if (!integer_digit(s, f, c)) {
          return false;
        }
        break;
      }
      case NodeKind::kLiteral:
        f.kind = FrameKind::kLiteral;
        f.a = 0;
        r = literal(f, c);
        if (r == Result::kFail || r == Result::kNotMine) return false;
        break;
      default: return false;
    }
    st.push_back(f);
    if (r == Result::kTakenDone) {
      st.pop_back();
      child_done(st);
    }
    return true;
  }

  const Program& p_;
  State& out_;
};

bool accepting_top(const Program& p, const Frame& f) {
  if (f.kind == FrameKind::kNumber) {
    const NumberSpec& s = p.numbers[p.nodes[f.node].index];
    switch (f.phase) {
      case kNumZero:
      case kNumInt: return integer_in_range(s, f);
      case kNumFrac:
      case kNumExp: return true;
      default: return false;
    }
  }
  if (f.kind == FrameKind::kLiteral) return p.literals[p.nodes[f.node].index].trie.terminal(f.a);
  return false;
}

uint64_t stack_hash(const Stack& st) {
  uint64_t h = st.size();
  for (const Frame& f : st) {
    h = h * 0x9E3779B97F4A7C15ull + (uint64_t{f.node} << 32 | uint64_t{static_cast<uint8_t>(f.kind)} << 24 |
                                     uint64_t{f.phase} << 16 | uint64_t{f.depth} << 8 | f.sub);
    h = h * 0x9E3779B97F4A7C15ull + (uint64_t{f.a} << 32 | f.b);
    h = h * 0x9E3779B97F4A7C15ull + f.v;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace

State initial_state(const Program& p) {
  State s;
  Frame root;
  root.node = p.root;
  root.kind = FrameKind::kRoot;
  root.phase = kRootStart;
  s.heads.push_back({root});
  s.n = 1;
  return s;
}

bool step(const Program& p, const State& in, uint8_t c, State& out) {
  out.n = 0;
  out.ended = in.ended;
  if (in.ended) return false;
  Stepper stepper(p, out);
  for (size_t i = 0; i < in.n; ++i) {
    const size_t h = stepper.new_head();
    out.heads[h] = in.heads[i];
    if (!stepper.run(h, c)) out.heads[h].clear();
  }
  // Drop the dead (empty) heads and duplicates (compared in full only when their hashes are
  // equal); keep every stack's storage in the pool.
  if (out.n == 1) {
    if (out.heads[0].empty()) out.n = 0;
    return out.n > 0;
  }
  thread_local std::vector<uint64_t> hashes;
  hashes.clear();
  size_t kept = 0;
  for (size_t i = 0; i < out.n; ++i) {
    if (out.heads[i].empty()) continue;
    const uint64_t hash = stack_hash(out.heads[i]);
    bool dup = false;
    for (size_t j = 0; j < kept && !dup; ++j) dup = hashes[j] == hash && out.heads[j] == out.heads[i];
    if (dup) continue;
    if (kept != i) std::swap(out.heads[kept], out.heads[i]);
    hashes.push_back(hash);
    ++kept;
  }
  // Beyond kMaxParses the later parses are dropped: each kept one is valid and can be finished,
  // so the text stays a prefix of a document and never reaches a dead end; only some of its
  // continuations may be refused (highly ambiguous anyOf nested in itself).
  out.n = std::min(kept, kMaxParses);
  return out.n > 0;
}

bool accepts_end(const Program& p, const State& s) {
  if (s.ended) return false;
  for (size_t i = 0; i < s.n; ++i) {
    const Stack& st = s.heads[i];
    if (st.size() == 1 && st[0].phase == kRootDone) return true;
    if (st.size() == 2 && accepting_top(p, st[1])) return true;
  }
  return false;
}

bool in_free_string(const Program& p, const State& s, uint32_t& max_chars) {
  if (s.ended || s.n == 0) return false;
  max_chars = 0;
  for (size_t i = 0; i < s.n; ++i) {
    const Stack& st = s.heads[i];
    const Frame& f = st.back();
    if (f.phase != kStrNormal) return false;
    if (f.kind == FrameKind::kString) {
      const StringSpec& spec = p.strings[p.nodes[f.node].index];
      const uint32_t room = spec.max_len == UINT32_MAX ? UINT32_MAX : spec.max_len - f.a;
      max_chars = std::max(max_chars, room);
    } else if (f.kind == FrameKind::kKey) {
      const Frame& obj = st[st.size() - 2];
      const ObjectSpec& o = p.objects[p.nodes[obj.node].index];
      if (o.additional == kNone || !p.feasible(o.additional, obj.depth)) return false;
      max_chars = UINT32_MAX;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace diffattn::grammar::detail

namespace diffattn::grammar {

Matcher::Matcher(Grammar g)
    : grammar_(std::move(g)),
      state_(std::make_unique<detail::State>(detail::initial_state(grammar_.program()))) {}

Matcher::Matcher(const Matcher& o)
    : grammar_(o.grammar_), state_(std::make_unique<detail::State>(*o.state_)) {}

Matcher& Matcher::operator=(const Matcher& o) {
  if (this != &o) {
    grammar_ = o.grammar_;
    state_ = std::make_unique<detail::State>(*o.state_);
  }
  return *this;
}

Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;
Matcher::~Matcher() = default;

bool Matcher::advance(std::string_view bytes) {
  if (bytes.empty()) return !state_->ended;
  if (!scratch_) scratch_ = std::make_unique<detail::State>();
  // Two buffers besides the state: the state itself changes only when every byte was taken.
  detail::State other;
  detail::State* cur = scratch_.get();
  detail::State* next = &other;
  if (!detail::step(grammar_.program(), *state_, static_cast<uint8_t>(bytes[0]), *cur)) return false;
  for (size_t i = 1; i < bytes.size(); ++i) {
    if (!detail::step(grammar_.program(), *cur, static_cast<uint8_t>(bytes[i]), *next)) return false;
    std::swap(cur, next);
  }
  std::swap(*state_, *cur);
  return true;
}

bool Matcher::accepts_end() const { return detail::accepts_end(grammar_.program(), *state_); }

bool Matcher::end() {
  if (!accepts_end()) return false;
  state_->ended = true;
  return true;
}

bool Matcher::ended() const { return state_->ended; }

std::bitset<256> Matcher::allowed_bytes() const {
  std::bitset<256> bits;
  detail::State tmp;
  for (int c = 0; c < 256; ++c) {
    if (detail::step(grammar_.program(), *state_, static_cast<uint8_t>(c), tmp)) bits.set(static_cast<size_t>(c));
  }
  return bits;
}

}  // namespace diffattn::grammar
