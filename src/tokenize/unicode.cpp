// Python's str character classes and case mappings over UTF-8 (unicode.h).
#include "tokenize/unicode.h"

#include <algorithm>
#include <iterator>

namespace diffattn::tokenize::unicode {

namespace {

struct CpRange {
  uint32_t first, last;
};
struct CaseMap {
  uint32_t cp;
  uint32_t to[3];  // up to three code points, 0-padded
};

#include "tokenize/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CpRange (&table)[N], uint32_t cp) {
  const CpRange* end = table + N;
  const CpRange* it = std::upper_bound(table, end, cp, [](uint32_t c, const CpRange& r) { return c < r.first; });
  return it != table && cp <= std::prev(it)->last;
}

template <size_t N>
const CaseMap* find_map(const CaseMap (&table)[N], uint32_t cp) {
  const CaseMap* end = table + N;
  const CaseMap* it = std::lower_bound(table, end, cp, [](const CaseMap& m, uint32_t c) { return m.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void append_mapped(std::string& out, const CaseMap* m, uint32_t cp) {
  if (m == nullptr) {
    append_utf8(out, cp);
    return;
  }
  for (uint32_t c : m->to) {
    if (c != 0) append_utf8(out, c);
  }
}

bool case_ignorable(uint32_t cp) { return in_ranges(kCaseIgnorable, cp); }

// Python's handle_capital_sigma: a final sigma follows a cased letter (skipping case-ignorable
// characters) and is not followed by one.
bool final_sigma(std::string_view s, size_t start, size_t after) {
  // Backwards: find the previous non-case-ignorable code point.
  size_t j = start;
  bool before = false;
  while (j > 0) {
    size_t k = j - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t t = k;
    const uint32_t c = next_cp(s, t);
    j = k;
    if (!case_ignorable(c)) {
      before = is_cased(c);
      break;
    }
  }
  if (!before) return false;
  size_t i = after;
  while (i < s.size()) {
    const uint32_t c = next_cp(s, i);
    if (!case_ignorable(c)) return !is_cased(c);
  }
  return true;
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

size_t count_cps(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_printable(uint32_t cp) { return !in_ranges(kNonPrintable, cp); }
bool is_alpha(uint32_t cp) { return in_ranges(kAlpha, cp); }
bool is_digit(uint32_t cp) { return in_ranges(kDigit, cp); }
bool is_decimal(uint32_t cp) { return in_ranges(kDecimal, cp); }
bool is_numeric(uint32_t cp) { return in_ranges(kNumeric, cp); }
bool is_lower(uint32_t cp) { return in_ranges(kLower, cp); }
bool is_upper(uint32_t cp) { return in_ranges(kUpper, cp); }
bool is_cased(uint32_t cp) { return in_ranges(kCased, cp); }

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_cp(s, i);
    if (cp < 0x80) {
      out += static_cast<char>(cp >= 'a' && cp <= 'z' ? cp - 32 : cp);
    } else {
      append_mapped(out, find_map(kToUpper, cp), cp);
    }
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = next_cp(s, i);
    if (cp < 0x80) {
      out += static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    } else if (cp == 0x3A3) {
      append_utf8(out, final_sigma(s, start, i) ? 0x3C2 : 0x3C3);
    } else {
      append_mapped(out, find_map(kToLower, cp), cp);
    }
  }
  return out;
}

namespace {

void append_title(std::string& out, uint32_t cp) {
  if (const CaseMap* m = find_map(kToTitle, cp)) {
    append_mapped(out, m, cp);
  } else {
    append_mapped(out, find_map(kToUpper, cp), cp);
  }
}

}  // namespace

std::string title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = next_cp(s, i);
    if (prev_cased) {
      if (cp == 0x3A3) {
        append_utf8(out, final_sigma(s, start, i) ? 0x3C2 : 0x3C3);
      } else {
        append_mapped(out, find_map(kToLower, cp), cp);
      }
    } else {
      append_title(out, cp);
    }
    prev_cased = is_cased(cp);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = next_cp(s, i);
    if (start == 0) {
      append_title(out, cp);
    } else if (cp == 0x3A3) {
      append_utf8(out, final_sigma(s, start, i) ? 0x3C2 : 0x3C3);
    } else {
      append_mapped(out, find_map(kToLower, cp), cp);
    }
  }
  return out;
}

std::string swapcase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = next_cp(s, i);
    if (is_upper(cp)) {
      if (cp == 0x3A3) {
        append_utf8(out, final_sigma(s, start, i) ? 0x3C2 : 0x3C3);
      } else {
        append_mapped(out, find_map(kToLower, cp), cp);
      }
    } else if (is_lower(cp)) {
      append_mapped(out, find_map(kToUpper, cp), cp);
    } else {
      append_utf8(out, cp);
    }
  }
  return out;
}

}  // namespace diffattn::tokenize::unicode
