// Unicode for the chat-template engine: UTF-8 walking, and str's character classes and case
// mappings exactly as Python's str has them (tables generated from Python's unicodedata by
// scripts/gen_unicode_tables.py), so |upper, .title(), .split(), repr() give Python's text.
// Strings are valid UTF-8 everywhere here (sources and inputs are checked on the way in).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace diffattn::tokenize::unicode {

// The code point at s[i] (i at a lead byte); i moves past it. s must be valid UTF-8.
inline uint32_t next_cp(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  const int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp);

// Offset of the first byte that is not valid UTF-8 (overlong forms, surrogates and code points
// above U+10FFFF are invalid), or npos.
size_t invalid_utf8_at(std::string_view s);

size_t count_cps(std::string_view s);

bool is_space(uint32_t cp);      // str.isspace
bool is_printable(uint32_t cp);  // str.isprintable (repr escapes the others)
bool is_alpha(uint32_t cp);
bool is_digit(uint32_t cp);
bool is_decimal(uint32_t cp);
bool is_numeric(uint32_t cp);
bool is_lower(uint32_t cp);
bool is_upper(uint32_t cp);
bool is_cased(uint32_t cp);
inline bool is_alnum(uint32_t cp) { return is_alpha(cp) || is_numeric(cp); }
inline bool is_word(uint32_t cp) { return cp == '_' || is_alnum(cp); }  // re's \w

std::string upper(std::string_view s);
std::string lower(std::string_view s);  // with the final-sigma rule
std::string title(std::string_view s);  // str.title
std::string capitalize(std::string_view s);  // str.capitalize (title-cases the first character)
std::string swapcase(std::string_view s);

}  // namespace diffattn::tokenize::unicode
