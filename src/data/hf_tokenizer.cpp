// Hugging Face tokenizer.json, byte-level BPE (include/diffattn/data/hf_tokenizer.h).
//
// encode(text): split out the added tokens (longest match first), pre-tokenize each remaining
// segment (regex splits, then bytes -> GPT-2's printable characters), run BPE on each piece
// (the pair of lowest merge rank first, a heap over a linked list: O(n log n) for a piece of n
// bytes, so a long run without spaces cannot hang it), then the template's special tokens.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "diffattn/data/hf_tokenizer.h"

#include <pcre2.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "diffattn/base/json_util.h"
#include "diffattn/base/error.h"
#include "diffattn/base/files.h"

namespace diffattn::data {

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxVocab = int64_t{1} << 24;

// GPT-2's regex, the ByteLevel pre-tokenizer's default (use_regex true).
const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The code point of byte b in GPT-2's bytes_to_unicode (0..323): printable bytes are
// themselves; the others are numbered from 256 in byte order.
int byte_code_point(int b) {
  auto printable = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE; };
  if (printable(b)) return b;
  int n = 0;
  for (int x = 0; x < b; ++x) n += !printable(x);
  return 256 + n;
}
constexpr int kByteCodePoints = 324;  // 256 + the 68 non-printable bytes

std::array<std::string, 256> byte_chars() {
  std::array<std::string, 256> out;
  for (int b = 0; b < 256; ++b) out[static_cast<size_t>(b)] = hf_byte_char(b);
  return out;
}

// The code point of the UTF-8 character at s[i] and its length in bytes (s is valid UTF-8).
std::pair<uint32_t, size_t> code_point_at(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return {cp, len};
}

// Byte offset of the first invalid UTF-8 sequence, or npos.
size_t utf8_error(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 0x6) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c >> 4) == 0xE) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c >> 3) == 0x1E) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

// The tokenizers library's regex engine (Oniguruma) and PCRE2 disagree on one whitespace
// character: PCRE2's \s (with PCRE2_UCP) keeps U+180E MONGOLIAN VOWEL SEPARATOR, which Unicode
// 6.3 moved out of White_Space; Oniguruma's \s is Unicode's: \t..\r, U+0085 and the Zs, Zl
// and Zp characters. So \s and \S (outside a class) and \s (inside one) are spelt out as that
// set before PCRE2 compiles the pattern (found by fuzz/tokenizer_vs_library.py: " \u180e"
// split as Llama 3's file would not). A \S inside a class is left as it is (no published
// pattern has one; PCRE2 cannot subtract inside a class).
std::string oniguruma_whitespace(const std::string& pattern) {
  static const char* kSet = "\\t-\\r\\x{85}\\p{Zs}\\p{Zl}\\p{Zp}";
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kSet) : "[" + std::string(kSet) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kSet) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // a ']' first in the class (after an optional '^') is a literal
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

// A compiled regex (PCRE2, UTF and Unicode properties, with Oniguruma's \s as the tokenizers
// library's engine).
class Regex {
 public:
  Regex(const std::string& source, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    const std::string pattern = oniguruma_whitespace(source);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw IoError(where + ": the regex does not compile at offset " + std::to_string(off) + " (" +
                    reinterpret_cast<const char*>(msg) + ")");
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // Isolated split: every match and every gap between matches is a piece, in order.
  void split(const std::string& s, std::vector<std::string>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0, gap = 0;
    while (pos <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;  // no more matches (the text was checked to be UTF-8)
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step one character on
        pos = b + 1;
        while (pos < s.size() && (static_cast<unsigned char>(s[pos]) >> 6) == 0x2) ++pos;
        continue;
      }
      if (b > gap) out.push_back(s.substr(gap, b - gap));
      out.push_back(s.substr(b, e - b));
      pos = gap = e;
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
};

// One step of the pre-tokenizer: a regex split, or the byte-level mapping (with its regex).
struct PreStep {
  std::unique_ptr<Regex> regex;  // null: no split
  bool byte_level = false;
  bool add_prefix_space = false;
};

std::string str_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) {
    throw IoError(where + ": \"" + key + "\" must be a string");
  }
  return j[key].get<std::string>();
}

bool bool_field(const json& j, const char* key, bool def, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) throw IoError(where + ": \"" + key + "\" must be true or false");
  return j[key].get<bool>();
}

// Escapes a literal string for use as a regex (Split with a String pattern).
std::string regex_quote(const std::string& s) { return "\\Q" + s + "\\E"; }

}  // namespace

std::string hf_byte_char(int b) {
  if (b < 0 || b > 255) throw InvalidArgument("hf_byte_char: byte " + std::to_string(b) + " is outside 0..255");
  const int cp = byte_code_point(b);
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

struct HfTokenizer::Impl {
  std::string where;
  std::unordered_map<std::string, int32_t> vocab;  // model vocabulary and added tokens
  std::vector<std::string> tokens;                 // id -> token string
  std::vector<char> special;                       // id -> special added token
  std::vector<char> added_id;                      // id -> an added token (special or not)
  std::vector<AddedToken> added;                   // longest content first
  std::array<std::vector<size_t>, 256> added_by_byte;  // indices into added by first byte
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, ab)
  bool ignore_merges = false;
  std::vector<PreStep> pre;
  std::vector<int32_t> prefix, suffix;  // the template's special tokens around the sequence
  int32_t bos = -1, eos = -1;           // tokenizer_config.json's
  std::array<std::string, 256> byte_char = byte_chars();
  std::array<int32_t, 256> byte_id{};
  std::array<int16_t, kByteCodePoints> cp_byte;  // code point -> byte (byte_char's inverse), -1

  void bpe(const std::string& piece, std::vector<int32_t>& out) const;
  void encode_segment(const std::string& seg, std::vector<int32_t>& out) const;
};

namespace {

void parse_pre(const json& j, const std::string& where, std::vector<PreStep>& steps) {
  if (j.is_null()) return;
  if (!j.is_object()) throw IoError(where + ": must be an object or null");
  const std::string type = str_field(j, "type", where);
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      throw IoError(where + ": a Sequence needs a \"pretokenizers\" list");
    }
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i) {
      parse_pre(j["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]", steps);
    }
  } else if (type == "ByteLevel") {
    PreStep s;
    s.byte_level = true;
    s.add_prefix_space = bool_field(j, "add_prefix_space", false, where);
    if (bool_field(j, "use_regex", true, where)) s.regex = std::make_unique<Regex>(kGpt2Regex, where);
    steps.push_back(std::move(s));
  } else if (type == "Split") {
    const std::string behavior = str_field(j, "behavior", where);
    if (behavior != "Isolated") {
      throw IoError(where + ": Split behavior \"" + behavior + "\" is not supported (Isolated)");
    }
    if (bool_field(j, "invert", false, where)) throw IoError(where + ": an inverted Split is not supported");
    if (!j.contains("pattern") || !j["pattern"].is_object()) {
      throw IoError(where + ": Split needs a \"pattern\" object");
    }
    const json& pat = j["pattern"];
    PreStep s;
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      s.regex = std::make_unique<Regex>(pat["Regex"].get<std::string>(), where + ".pattern");
    } else if (pat.contains("String") && pat["String"].is_string()) {
      s.regex = std::make_unique<Regex>(regex_quote(pat["String"].get<std::string>()), where + ".pattern");
    } else {
      throw IoError(where + ": pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    steps.push_back(std::move(s));
  } else {
    throw IoError(where + ": pre-tokenizer type \"" + type +
                  "\" is not supported (ByteLevel, Split, Sequence)");
  }
}

void parse_post(const json& j, const std::string& where,
                const std::unordered_map<std::string, int32_t>& vocab,
                std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (j.is_null()) return;
  if (!j.is_object()) throw IoError(where + ": must be an object or null");
  const std::string type = str_field(j, "type", where);
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      throw IoError(where + ": a Sequence needs a \"processors\" list");
    }
    for (size_t i = 0; i < j["processors"].size(); ++i) {
      parse_post(j["processors"][i], where + ".processors[" + std::to_string(i) + "]", vocab, prefix,
                 suffix);
    }
  } else if (type == "ByteLevel") {
    // Offsets only: nothing to do for ids.
  } else if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array()) {
      throw IoError(where + ": TemplateProcessing needs a \"single\" list");
    }
    bool seen_sequence = false;
    for (const json& item : j["single"]) {
      if (item.is_object() && item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object()) {
        throw IoError(where + ": a template item must be a Sequence or a SpecialToken");
      }
      const std::string name = str_field(item["SpecialToken"], "id", where + " SpecialToken");
      std::vector<int32_t> ids;
      const json* st = nullptr;
      if (j.contains("special_tokens") && j["special_tokens"].is_object() &&
          j["special_tokens"].contains(name)) {
        st = &j["special_tokens"][name];
      }
      if (st && st->contains("ids") && (*st)["ids"].is_array()) {
        for (const json& x : (*st)["ids"]) {
          if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= kMaxVocab) {
            throw IoError(where + ": special token \"" + name + "\" has an id out of range");
          }
          ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
        }
      } else {
        auto it = vocab.find(name);
        if (it == vocab.end()) throw IoError(where + ": special token \"" + name + "\" is not a token");
        ids.push_back(it->second);
      }
      (seen_sequence ? suffix : prefix).insert((seen_sequence ? suffix : prefix).end(), ids.begin(), ids.end());
    }
    if (!seen_sequence) throw IoError(where + ": the \"single\" template has no Sequence");
  } else {
    throw IoError(where + ": post-processor type \"" + type +
                  "\" is not supported (ByteLevel, TemplateProcessing, Sequence)");
  }
}

}  // namespace

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

HfTokenizer HfTokenizer::from_json(const std::string& text, const std::string& where) {
  json j;
  try {
    // A key twice (a token in vocab, "merges", "model"): the library keeps one of them, and
    // which one is an accident of its deserializer; refused.
    j = parse_json_object(text, where, json_no_duplicates);
  } catch (const InvalidArgument& e) {
    throw IoError(e.what());
  }
  auto t = std::make_unique<Impl>();
  t->where = where;
  t->cp_byte.fill(-1);
  for (int b = 0; b < 256; ++b) t->cp_byte[static_cast<size_t>(byte_code_point(b))] = static_cast<int16_t>(b);

  if (!j.contains("model") || !j["model"].is_object()) throw IoError(where + ": no \"model\" object");
  const json& m = j["model"];
  const std::string mw = where + ": model";
  if (m.contains("type") && !(m["type"].is_string() && m["type"].get<std::string>() == "BPE")) {
    throw IoError(mw + ": type " + json_brief(m["type"]) + " is not supported (BPE)");
  }
  if (!m.contains("vocab") || !m["vocab"].is_object() || !m.contains("merges") || !m["merges"].is_array()) {
    throw IoError(mw + ": a BPE model needs a \"vocab\" object and a \"merges\" list");
  }
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0)) {
    throw IoError(mw + ": BPE dropout is not supported");
  }
  if (bool_field(m, "byte_fallback", false, mw)) throw IoError(mw + ": byte_fallback is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty())) {
      throw IoError(mw + ": " + key + " is not supported");
    }
  }
  t->ignore_merges = bool_field(m, "ignore_merges", false, mw);

  int64_t n_ids = 0;
  // Grows the id tables to hold id (checked against the limit).
  auto reserve_id = [&](int64_t id, const std::string& what) {
    if (id < 0 || id >= kMaxVocab) {
      throw IoError(what + ": id " + std::to_string(id) + " is outside 0.." + std::to_string(kMaxVocab - 1));
    }
    if (id >= n_ids) {
      n_ids = id + 1;
      t->tokens.resize(static_cast<size_t>(n_ids));
      t->special.resize(static_cast<size_t>(n_ids), 0);
      t->added_id.resize(static_cast<size_t>(n_ids), 0);
    }
  };
  // An id as the library reads it (a u32): a JSON integer without a sign.
  auto id_value = [&](const json& v, const std::string& what) -> int64_t {
    if (!v.is_number_unsigned()) throw IoError(what + ": the id " + json_brief(v) + " is not a whole number >= 0");
    const uint64_t id = v.get<uint64_t>();
    return id >= static_cast<uint64_t>(kMaxVocab) ? kMaxVocab : static_cast<int64_t>(id);
  };
  for (const auto& [tok, id] : m["vocab"].items()) {
    const std::string what = mw + ".vocab[" + quote_name(tok, 40) + "]";
    const int64_t i = id_value(id, what);
    reserve_id(i, what);
    if (utf8_error(tok) != std::string::npos) throw IoError(what + ": the token is not valid UTF-8");
    if (tok.empty()) throw IoError(what + ": the empty string is not a token (id " + std::to_string(i) + ")");
    // Two strings for one id: decoding the id would give either, depending on the library's
    // hash order.
    std::string& slot = t->tokens[static_cast<size_t>(i)];
    if (!slot.empty()) {
      throw IoError(what + ": id " + std::to_string(i) + " is also the id of " + quote_name(slot, 40) +
                    " (one id, one token)");
    }
    slot = tok;
    t->vocab[tok] = static_cast<int32_t>(i);
  }
  // What the library calls the model's vocabulary size: its entries (holes do not count).
  const int64_t model_entries = static_cast<int64_t>(t->vocab.size());
  for (int b = 0; b < 256; ++b) {
    auto it = t->vocab.find(t->byte_char[static_cast<size_t>(b)]);
    t->byte_id[static_cast<size_t>(b)] = it == t->vocab.end() ? -1 : it->second;
  }
  // Merges: rank = position; "a b" or ["a", "b"].
  const json& merges = m["merges"];
  t->merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    const json& e = merges[r];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos) {
        throw IoError(mw + ".merges[" + std::to_string(r) + "]: expected \"a b\", got " + json_brief(e));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw IoError(mw + ".merges[" + std::to_string(r) + "]: expected \"a b\" or [a, b], got " + json_brief(e));
    }
    auto ia = t->vocab.find(a), ib = t->vocab.find(b), iab = t->vocab.find(a + b);
    const std::string what = mw + ".merges[" + std::to_string(r) + "]";
    for (auto [it, part] : {std::pair{ia, &a}, std::pair{ib, &b}}) {
      if (it == t->vocab.end()) throw IoError(what + ": " + quote_name(*part, 40) + " is not in the vocab");
    }
    // A merge whose result has no id: the tokenizers library refuses the file ("Token ... out of
    // vocabulary"), so does this (GPT-2's tokenizer.json has one, "\u0120Cla ude", and neither
    // the library nor transformers loads it).
    if (iab == t->vocab.end()) {
      throw IoError(what + ": " + quote_name(a + " " + b, 40) + " merges into " + quote_name(a + b, 40) +
                    ", which is not in the vocab (the tokenizers library refuses such a file)");
    }
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second);
    // A pair listed twice takes its last rank, as the library's map does.
    t->merges.insert_or_assign(key, std::make_pair(static_cast<int32_t>(r), iab->second));
  }

  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) throw IoError(where + ": \"added_tokens\" must be a list");
    // The ids the library gives added tokens, whatever the file says: a token of the model's
    // vocab keeps its id, one added before keeps that one, any other takes the next id past
    // the model's entries and the added ids so far (AddedVocabulary::add_tokens). A file whose
    // ids differ (an added token on an id the vocab already gives another string: the byte
    // \x03 would decode as <|eot_id|>) is refused rather than read two ways.
    std::unordered_map<std::string, int32_t> added_ids;
    int64_t max_added = -1;
    for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
      const json& a = j["added_tokens"][i];
      const std::string aw = where + ": added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id")) throw IoError(aw + ": needs an integer \"id\"");
      AddedToken tok;
      tok.content = str_field(a, "content", aw);
      if (tok.content.empty()) throw IoError(aw + ": empty content");
      if (utf8_error(tok.content) != std::string::npos) throw IoError(aw + ": the content is not valid UTF-8");
      tok.special = bool_field(a, "special", false, aw);
      const int64_t id = id_value(a["id"], aw);
      int64_t expected;
      if (auto it = added_ids.find(tok.content); it != added_ids.end()) {
        expected = it->second;
      } else if (auto v = t->vocab.find(tok.content); v != t->vocab.end()) {
        expected = v->second;
      } else {
        expected = max_added < 0 ? model_entries
                                 : (max_added >= model_entries || model_entries == 0 ? max_added + 1 : model_entries);
      }
      if (id != expected) {
        const bool taken = id < n_ids && !t->tokens[static_cast<size_t>(id)].empty() &&
                           t->tokens[static_cast<size_t>(id)] != tok.content;
        throw IoError(aw + ": " + quote_name(tok.content, 40) + " has id " + std::to_string(id) +
                      (taken ? ", the id of " + quote_name(t->tokens[static_cast<size_t>(id)], 40) : std::string()) +
                      "; the tokenizers library gives it id " + std::to_string(expected) +
                      " (a file whose ids disagree with the library's is refused)");
      }
      reserve_id(id, aw);
      if (!added_ids.count(tok.content)) {
        std::string& slot = t->tokens[static_cast<size_t>(id)];
        if (!slot.empty() && slot != tok.content) {
          throw IoError(aw + ": id " + std::to_string(id) + " is also the id of " + quote_name(slot, 40));
        }
        slot = tok.content;
        t->vocab[tok.content] = static_cast<int32_t>(id);
        added_ids[tok.content] = static_cast<int32_t>(id);
        max_added = std::max(max_added, id);
      }
      tok.id = static_cast<int32_t>(id);
      t->special[static_cast<size_t>(id)] = t->special[static_cast<size_t>(id)] || tok.special;
      t->added_id[static_cast<size_t>(id)] = 1;
      t->added.push_back(tok);
    }
    std::stable_sort(t->added.begin(), t->added.end(), [](const AddedToken& x, const AddedToken& y) {
      return x.content.size() > y.content.size();
    });
    for (size_t i = 0; i < t->added.size(); ++i) {
      t->added_by_byte[static_cast<unsigned char>(t->added[i].content[0])].push_back(i);
    }
  }

  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    throw IoError(where + ": normalizer " + json_brief(j["normalizer"].value("type", json())) +
                  " is not supported (byte-level BPE files have none)");
  }
  parse_pre(j.value("pre_tokenizer", json()), where + ": pre_tokenizer", t->pre);
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    const json& d = j["decoder"];
    if (!d.is_object() || d.value("type", "") != "ByteLevel") {
      throw IoError(where + ": decoder " + json_brief(d.is_object() ? d.value("type", json()) : d) +
                    " is not supported (ByteLevel)");
    }
  }
  bool byte_level = false;
  for (const PreStep& s : t->pre) byte_level = byte_level || s.byte_level;
  if (!byte_level) throw IoError(where + ": the pre-tokenizer has no ByteLevel step (only byte-level BPE is supported)");
  for (int b = 0; b < 256; ++b) {
    if (t->byte_id[static_cast<size_t>(b)] < 0) {
      throw IoError(where + ": the vocab has no token for byte " + std::to_string(b) +
                    " (\"" + t->byte_char[static_cast<size_t>(b)] + "\"): not a byte-level vocabulary");
    }
  }
  parse_post(j.value("post_processor", json()), where + ": post_processor", t->vocab, t->prefix,
             t->suffix);
  for (const std::vector<int32_t>* side : {&t->prefix, &t->suffix}) {
    for (int32_t id : *side) {
      if (id >= n_ids || t->tokens[static_cast<size_t>(id)].empty()) {
        throw IoError(where + ": post_processor: id " + std::to_string(id) + " is not a token");
      }
    }
  }
  return HfTokenizer(std::move(t));
}

HfTokenizer HfTokenizer::load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    HfTokenizer t = from_json(read_file(path + "/tokenizer.json"), path + "/tokenizer.json");
    const std::string cfg = path + "/tokenizer_config.json";
    if (::stat(cfg.c_str(), &st) == 0) t.apply_config(read_file(cfg), cfg);
    return t;
  }
  return from_json(read_file(path), path);
}

void HfTokenizer::apply_config(const std::string& text, const std::string& where) {
  json j;
  try {
    j = parse_json_object(text, where);
  } catch (const InvalidArgument& e) {
    throw IoError(e.what());
  }
  Impl& t = *impl_;
  auto token_of = [&](const char* key) -> int32_t {
    if (!j.contains(key) || j[key].is_null()) return -1;
    const json& v = j[key];
    std::string s;
    if (v.is_string()) {
      s = v.get<std::string>();
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      s = v["content"].get<std::string>();
    } else {
      throw IoError(where + ": \"" + key + "\" must be a string or {\"content\": ...}, got " +
                    json_brief(v));
    }
    auto it = t.vocab.find(s);
    if (it == t.vocab.end()) throw IoError(where + ": " + key + " \"" + s + "\" is not a token");
    return it->second;
  };
  if (const int32_t b = token_of("bos_token"); b >= 0) t.bos = b;  // absent: kept
  if (const int32_t e = token_of("eos_token"); e >= 0) t.eos = e;
  auto place = [&](const char* key, int32_t id, std::vector<int32_t>& side, bool front) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_boolean()) throw IoError(where + ": \"" + key + "\" must be true or false");
    const bool on = j[key].get<bool>();
    if (on && id < 0) throw IoError(where + ": " + key + " is true but no token is named");
    side.erase(std::remove(side.begin(), side.end(), id), side.end());
    if (on) side.insert(front ? side.begin() : side.end(), id);
  };
  place("add_bos_token", t.bos, t.prefix, true);
  place("add_eos_token", t.eos, t.suffix, false);
}

int32_t HfTokenizer::bos_id() const { return impl_->bos; }
int32_t HfTokenizer::eos_id() const { return impl_->eos; }

std::string TokenStreamer::push(int32_t id) {
  pending_ += tok_.decode({id}, skip_special_);
  // The longest prefix of whole UTF-8 characters: cut before an incomplete last sequence.
  size_t cut = pending_.size();
  for (size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(pending_[pending_.size() - back]);
    if ((c >> 6) == 0x2) continue;  // a continuation byte: look further back
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (need > back) cut = pending_.size() - back;
    break;
  }
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string TokenStreamer::finish() {
  std::string out;
  if (!pending_.empty()) out = "\xEF\xBF\xBD";  // U+FFFD for an unfinished character
  pending_.clear();
  return out;
}

void HfTokenizer::Impl::bpe(const std::string& piece, std::vector<int32_t>& out) const {
  // piece is in byte-level characters (code points below kByteCodePoints).
  if (ignore_merges) {
    auto it = vocab.find(piece);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols: one per byte-level character, as ids, in a doubly linked list.
  std::vector<int32_t> id;
  for (size_t i = 0; i < piece.size();) {
    const auto [cp, len] = code_point_at(piece, i);
    id.push_back(byte_id[static_cast<size_t>(cp_byte[cp])]);
    i += len;
  }
  const int n = static_cast<int>(id.size());
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  std::vector<char> alive(static_cast<size_t>(n), 1);
  for (int i = 0; i < n; ++i) {
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  // Candidate merges (rank, left position, left id, right id, merged id): stale entries are
  // skipped.
  struct Cand {
    int32_t rank;
    int left;
    int32_t a, b, ab;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int l) {
    if (l < 0) return;
    const int r = next[static_cast<size_t>(l)];
    if (r < 0) return;
    const int32_t a = id[static_cast<size_t>(l)], b = id[static_cast<size_t>(r)];
    auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    if (it != merges.end()) heap.push({it->second.first, l, a, b, it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int l = c.left;
    if (!alive[static_cast<size_t>(l)] || id[static_cast<size_t>(l)] != c.a) continue;
    const int r = next[static_cast<size_t>(l)];
    if (r < 0 || id[static_cast<size_t>(r)] != c.b) continue;
    id[static_cast<size_t>(l)] = c.ab;
    alive[static_cast<size_t>(r)] = 0;
    next[static_cast<size_t>(l)] = next[static_cast<size_t>(r)];
    if (next[static_cast<size_t>(r)] >= 0) prev[static_cast<size_t>(next[static_cast<size_t>(r)])] = l;
    consider(prev[static_cast<size_t>(l)]);
    consider(l);
  }
  for (int i = 0; i >= 0 && n > 0; i = next[static_cast<size_t>(i)]) out.push_back(id[static_cast<size_t>(i)]);
}

void HfTokenizer::Impl::encode_segment(const std::string& seg, std::vector<int32_t>& out) const {
  // Pre-tokenize: each step splits every piece further; the byte-level step maps bytes to
  // characters (after its own regex split, on the raw bytes).
  std::vector<std::string> pieces{seg}, next;
  bool mapped = false;
  for (const PreStep& s : pre) {
    next.clear();
    for (std::string& p : pieces) {
      if (s.add_prefix_space && !p.empty() && p[0] != ' ' && &p == &pieces.front()) p.insert(p.begin(), ' ');
      if (s.regex) {
        s.regex->split(p, next);
      } else {
        next.push_back(std::move(p));
      }
    }
    pieces.swap(next);
    if (s.byte_level && !mapped) {
      for (std::string& p : pieces) {
        std::string m;
        for (unsigned char c : p) m += byte_char[c];
        p.swap(m);
      }
      mapped = true;
    }
  }
  for (const std::string& p : pieces) {
    if (!p.empty()) bpe(p, out);
  }
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  const Impl& t = *impl_;
  if (const size_t at = utf8_error(text); at != std::string::npos) {
    throw InvalidArgument("encode: the text is not valid UTF-8 (byte " + std::to_string(at) + ")");
  }
  std::vector<int32_t> out;
  if (add_special_tokens) out = t.prefix;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    for (size_t k : t.added_by_byte[static_cast<unsigned char>(text[i])]) {
      const AddedToken& a = t.added[k];
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;  // longest first
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) t.encode_segment(text.substr(start, i - start), out);
    out.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  if (start < text.size()) t.encode_segment(text.substr(start), out);
  if (add_special_tokens) out.insert(out.end(), t.suffix.begin(), t.suffix.end());
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const Impl& t = *impl_;
  std::string out;
  for (size_t n = 0; n < ids.size(); ++n) {
    const int32_t id = ids[n];
    if (id < 0 || id >= static_cast<int32_t>(t.tokens.size()) || t.tokens[static_cast<size_t>(id)].empty()) {
      throw InvalidArgument("decode: ids[" + std::to_string(n) + "] = " + std::to_string(id) +
                            " is not a token of " + t.where);
    }
    if (t.special[static_cast<size_t>(id)]) {
      if (!skip_special) out += t.tokens[static_cast<size_t>(id)];
      continue;
    }
    const std::string& s = t.tokens[static_cast<size_t>(id)];
    if (t.added_id[static_cast<size_t>(id)]) {
      out += s;
      continue;
    }
    // Byte-level characters back to bytes; a character outside the map is kept as UTF-8.
    for (size_t i = 0; i < s.size();) {
      const auto [cp, len] = code_point_at(s, i);
      if (cp < static_cast<uint32_t>(kByteCodePoints) && t.cp_byte[cp] >= 0) {
        out.push_back(static_cast<char>(t.cp_byte[cp]));
      } else {
        out.append(s, i, len);
      }
      i += len;
    }
  }
  return out;
}

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

const std::string& HfTokenizer::token(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(impl_->tokens.size())) {
    throw InvalidArgument("token: id " + std::to_string(id) + " is outside 0.." +
                          std::to_string(impl_->tokens.size() - 1));
  }
  return impl_->tokens[static_cast<size_t>(id)];
}

int32_t HfTokenizer::id_of(const std::string& token) const {
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

bool HfTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(impl_->special.size()) && impl_->special[static_cast<size_t>(id)];
}

}  // namespace diffattn::data
