// Token masks (token_mask.h): a depth-first walk of the vocabulary's byte trie, one automaton
// step per edge, from the state of the matcher; a token is allowed when the walk reaches its
// node. Inside a string that takes any character (the state of most steps of free text), the
// "plain" tokens (complete UTF-8 characters, none of '"', '\' or a control character) are all
// allowed up to the string's room, so they come from a table sorted by their length in
// characters, and only the other tokens' trie is walked.
#include "diffattn/grammar/token_mask.h"

#include <algorithm>
#include <cstring>

#include "grammar/program.h"

namespace diffattn::grammar {

namespace {

// Code points of s when s is whole UTF-8 characters with no '"', '\' or control character; -1
// otherwise.
int64_t plain_chars(const std::string& s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x20 || c == '"' || c == '\\') return -1;
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return -1;
    if (i + len > s.size()) return -1;
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<uint8_t>(s[i + k]);
      if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) return -1;
    }
    i += len;
    ++n;
  }
  return n;
}

}  // namespace

struct TokenMasker::Impl {
  int64_t V = 0;
  std::vector<std::string> bytes;   // (V) "" where not text
  std::vector<uint8_t> eos;         // (V)
  std::vector<int32_t> eos_ids;
  detail::ByteTrie all;             // every text token; payload = id
  detail::ByteTrie other;           // the text tokens that are not plain; payload = id
  std::vector<int32_t> plain_by_chars;  // plain ids, fewest characters first
  std::vector<uint32_t> plain_upto;     // [k]: how many plain ids have at most k characters
  std::vector<uint8_t> plain_mask;      // (V) 1 for every plain id
  size_t max_len = 0;

  void walk(const detail::Program& p, const detail::ByteTrie& t, const detail::State& s0,
            uint8_t* mask) const {
    thread_local std::vector<detail::State> states;
    struct Pos {
      uint32_t node, edge;
    };
    thread_local std::vector<Pos> stack;
    if (states.size() < max_len + 2) states.resize(max_len + 2);
    stack.clear();
    stack.push_back({0, 0});
    while (!stack.empty()) {
      Pos& top = stack.back();
      const detail::ByteTrie::Node& n = t.nodes[top.node];
      if (top.edge == n.n_edges) {
        stack.pop_back();
        continue;
      }
      const uint32_t e = n.first_edge + top.edge++;
      const size_t d = stack.size() - 1;
      const detail::State& cur = d == 0 ? s0 : states[d];
      if (!detail::step(p, cur, t.edge_byte[e], states[d + 1])) continue;
      const uint32_t child = t.edge_child[e];
      const detail::ByteTrie::Node& cn = t.nodes[child];
      for (uint32_t i = 0; i < cn.n_payload; ++i) mask[t.payload[cn.first_payload + i]] = 1;
      if (cn.n_edges > 0) stack.push_back({child, 0});
    }
  }
};

TokenMasker::TokenMasker(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.V = static_cast<int64_t>(token_bytes.size());
  m.eos.assign(token_bytes.size(), 0);
  for (int32_t e : eos_ids) {
    if (e < 0 || e >= m.V) {
      throw InvalidArgument("TokenMasker: end-of-sequence id " + std::to_string(e) + " is outside the vocabulary (" +
                            std::to_string(m.V) + " ids)");
    }
    m.eos[static_cast<size_t>(e)] = 1;
    m.eos_ids.push_back(e);
    token_bytes[static_cast<size_t>(e)].clear();
  }
  std::vector<std::string> other(token_bytes.size());
  std::vector<std::pair<int64_t, int32_t>> plain;  // (characters, id)
  m.plain_mask.assign(token_bytes.size(), 0);
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    const std::string& b = token_bytes[id];
    if (b.empty()) continue;
    m.max_len = std::max(m.max_len, b.size());
    const int64_t chars = plain_chars(b);
    if (chars > 0) {
      plain.emplace_back(chars, static_cast<int32_t>(id));
      m.plain_mask[id] = 1;
    } else {
      other[id] = b;
    }
  }
  std::stable_sort(plain.begin(), plain.end());
  const size_t most = plain.empty() ? 0 : static_cast<size_t>(plain.back().first);
  m.plain_upto.assign(most + 1, 0);
  for (const auto& [chars, id] : plain) {
    m.plain_by_chars.push_back(id);
    ++m.plain_upto[static_cast<size_t>(chars)];
  }
  for (size_t k = 1; k <= most; ++k) m.plain_upto[k] += m.plain_upto[k - 1];
  m.all = detail::ByteTrie::build(token_bytes);
  m.other = detail::ByteTrie::build(other);
  m.bytes = std::move(token_bytes);
}

TokenMasker::TokenMasker(TokenMasker&&) noexcept = default;
TokenMasker& TokenMasker::operator=(TokenMasker&&) noexcept = default;
TokenMasker::~TokenMasker() = default;

int64_t TokenMasker::vocab_size() const { return impl_->V; }

size_t TokenMasker::trie_nodes() const { return impl_->all.nodes.size(); }

bool TokenMasker::is_eos(int32_t id) const {
  return id >= 0 && id < impl_->V && impl_->eos[static_cast<size_t>(id)];
}

void TokenMasker::allowed(const Matcher& matcher, std::vector<uint8_t>& mask) const {
  const Impl& m = *impl_;
  mask.assign(static_cast<size_t>(m.V), 0);
  const detail::State& s = matcher.state();
  if (s.ended) return;
  const detail::Program& p = matcher.grammar().program();
  uint32_t room;
  if (detail::in_free_string(p, s, room)) {
    if (room >= m.plain_upto.size()) {
      std::memcpy(mask.data(), m.plain_mask.data(), mask.size());
    } else {
      const uint32_t n = m.plain_upto[room];
      for (uint32_t i = 0; i < n; ++i) mask[static_cast<size_t>(m.plain_by_chars[i])] = 1;
    }
    m.walk(p, m.other, s, mask.data());
  } else {
    m.walk(p, m.all, s, mask.data());
  }
  if (detail::accepts_end(p, s)) {
    for (int32_t id : m.eos_ids) mask[static_cast<size_t>(id)] = 1;
  }
}

bool TokenMasker::advance(Matcher& matcher, int32_t id) const {
  if (id < 0 || id >= impl_->V) return false;
  if (impl_->eos[static_cast<size_t>(id)]) return matcher.end();
  const std::string& b = impl_->bytes[static_cast<size_t>(id)];
  return !b.empty() && matcher.advance(b);
}

}  // namespace diffattn::grammar
