// The compiled form of a JSON schema (src/grammar, private): a graph of nodes, each a concrete
// kind of JSON value (object, array, string, number, a finite set of literal texts) or an
// alternation of other nodes, and the pushdown automaton's state: a few parses at once (heads),
// each a stack of frames. json_schema.cpp builds the graph, matcher.cpp steps the automaton,
// token_mask.cpp walks a vocabulary trie with it.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace diffattn::grammar::detail {

inline constexpr uint32_t kNone = UINT32_MAX;
// min_depth of a node that has no document within kMaxDocumentDepth levels.
inline constexpr uint8_t kNoDepth = 255;

// A byte trie of a finite set of byte strings; payload: what ends at a node (indices into the
// caller's list, in increasing order), so a node is terminal when it has payload.
struct ByteTrie {
  struct Node {
    uint32_t first_edge = 0, n_edges = 0;
    uint32_t first_payload = 0, n_payload = 0;
  };
  std::vector<Node> nodes;         // nodes[0] is the root
  std::vector<uint8_t> edge_byte;  // per node, its edges sorted by byte
  std::vector<uint32_t> edge_child;
  std::vector<uint32_t> payload;

  // The child of node along byte c, or kNone.
  uint32_t child(uint32_t node, uint8_t c) const {
    const Node& n = nodes[node];
    const uint8_t* b = edge_byte.data() + n.first_edge;
    uint32_t lo = 0, hi = n.n_edges;
    while (lo < hi) {  // binary search: a root may have 256 edges
      const uint32_t mid = (lo + hi) / 2;
      if (b[mid] < c) lo = mid + 1; else hi = mid;
    }
    return lo < n.n_edges && b[lo] == c ? edge_child[n.first_edge + lo] : kNone;
  }
  bool terminal(uint32_t node) const { return nodes[node].n_payload > 0; }
  // strings[i] with payload i (several strings may be equal: one node, several payloads).
  static ByteTrie build(const std::vector<std::string>& strings);
};

enum class NodeKind : uint8_t { kEmpty, kAlt, kObject, kArray, kString, kNumber, kLiteral };

struct ObjectSpec {
  struct Prop {
    std::string key;   // the name as canonical JSON string content (escaped, no quotes)
    uint32_t value;    // node of its value
    bool required;
  };
  std::vector<Prop> props;            // in the schema's order
  uint32_t additional = kNone;        // node of other properties' values; kNone: none allowed
  std::vector<uint32_t> next_required;      // (props + 1) first required index >= p, else props
  std::vector<uint8_t> suffix_min_depth;    // (props + 1) min over i >= p of min_depth(value)
  ByteTrie keys;                            // the declared names, payload = property index
  std::vector<std::vector<uint32_t>> below; // per key-trie node, sorted property indices below it
};

struct ArraySpec {
  uint32_t items = kNone;
  uint32_t min_items = 0, max_items = UINT32_MAX;  // UINT32_MAX: no bound
};

struct StringSpec {
  uint32_t min_len = 0, max_len = UINT32_MAX;  // code points; UINT32_MAX: no bound
};

struct NumberSpec {
  bool integer = false;
  bool ranged = false;   // integers only: lo <= value <= hi
  __int128 lo = 0, hi = 0;
};

struct LiteralSpec {
  std::vector<nlohmann::json> candidates;  // enum/const values (compared as JSON values)
  uint32_t rest = kNone;                   // the schema's other keywords, or kNone
  std::vector<std::string> texts;          // the kept values, written compactly
  ByteTrie trie;                           // of texts
  uint8_t depth = 0;                       // deepest nesting among texts
};

struct Node {
  NodeKind kind = NodeKind::kEmpty;
  uint32_t index = 0;                 // into the table of its kind
  uint8_t min_depth = kNoDepth;       // levels of nesting the smallest document needs
  std::bitset<256> first;             // bytes a value of a concrete node may start with
  std::vector<uint32_t> leaves;       // kAlt: the concrete nodes it stands for (flattened)
  std::vector<uint32_t> children;     // kAlt: its alternatives as written
  std::string path;                   // JSON pointer of the schema it came from (errors)
};

struct Program {
  std::vector<Node> nodes;
  std::vector<ObjectSpec> objects;
  std::vector<ArraySpec> arrays;
  std::vector<StringSpec> strings;
  std::vector<NumberSpec> numbers;
  std::vector<LiteralSpec> literals;
  uint32_t root = kNone;

  bool feasible(uint32_t node, uint32_t depth) const;  // depth + min_depth <= kMaxDocumentDepth
};

// ---- the automaton's state ----

enum class FrameKind : uint8_t { kRoot, kObject, kKey, kArray, kString, kNumber, kLiteral };

// One level of a parse. Unused fields stay zero, so equal parses compare equal.
struct Frame {
  uint32_t node = 0;     // the concrete node (kKey: its object's node)
  FrameKind kind = FrameKind::kRoot;
  uint8_t phase = 0;     // where in the value (per kind, matcher.cpp)
  uint8_t depth = 0;     // objects and arrays open up to and including this frame
  uint8_t sub = 0;       // a lexer detail (digits of an escape, UTF-8 bytes left, sign)
  uint32_t a = 0;        // object: next declared index; key: trie node; array: items so far;
                         // string: code points so far; number: integer digits; literal: trie node
  uint32_t b = 0;        // object: the property being read; string/key: UTF-8 byte range;
                         // number: fraction digits | exponent digits << 8
  uint64_t v = 0;        // number: magnitude of the integer part; string: \u code unit
  bool operator==(const Frame&) const = default;
};

using Stack = std::vector<Frame>;

// The parses still alive after the bytes so far. heads[0, n) are in use; the pool keeps the
// others' storage so that stepping a state allocates nothing once warm.
struct State {
  std::vector<Stack> heads;
  size_t n = 0;
  bool ended = false;  // the end of the document was taken (end of sequence)
};

// Steps every head of `in` by byte c into `out` (cleared first). False (out then has no
// heads) when no parse takes c. At most kMaxParses heads are kept (the first ones).
bool step(const Program& p, const State& in, uint8_t c, State& out);
bool accepts_end(const Program& p, const State& s);
// The state before any byte.
State initial_state(const Program& p);
// For token masks: true when every head is inside a string that takes any further complete
// characters other than '"', '\\' and control characters; max_chars gets how many more
// characters the roomiest head takes (UINT32_MAX: no bound).
bool in_free_string(const Program& p, const State& s, uint32_t& max_chars);

}  // namespace diffattn::grammar::detail
