// Numbers and tables as text (include/diffattn/base/text.h).
#include "diffattn/base/text.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace diffattn {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  // "-0.0000" reads as a sign error; print it as zero.
  if (s.find_first_not_of("-0.") == std::string::npos && s[0] == '-') s.erase(0, 1);
  return s;
}

std::string plural(long long n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

namespace {

std::string escape_pipes(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

void print_table(std::ostream& os, const std::vector<std::string>& header_in,
                 const std::vector<std::vector<std::string>>& rows_in, TableStyle style) {
  const bool md = style == TableStyle::Markdown;
  std::vector<std::string> header = header_in;
  std::vector<std::vector<std::string>> rows = rows_in;
  if (md) {
    for (std::string& h : header) h = escape_pipes(h);
    for (auto& r : rows) {
      for (std::string& c : r) c = escape_pipes(c);
    }
  }
  std::vector<size_t> width(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  const std::string sep = md ? " | " : "  ";
  auto line = [&](const std::vector<std::string>& r) {
    if (md) os << "| ";
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      const std::string pad(width[c] - std::min(width[c], cell.size()), ' ');
      os << (c ? sep : "") << (c == 0 ? cell + pad : pad + cell);
    }
    os << (md ? " |\n" : "\n");
  };
  line(header);
  if (md) {
    os << "|";
    for (size_t c = 0; c < width.size(); ++c) {
      os << (c == 0 ? " :" : " ") << std::string(std::max<size_t>(width[c], 3) - 1, '-')
         << (c == 0 ? " |" : ": |");
    }
    os << "\n";
  } else if (style == TableStyle::Ruled) {
    size_t total = 0;
    for (size_t c = 0; c < width.size(); ++c) total += width[c] + (c + 1 < width.size() ? 2 : 0);
    os << std::string(total, '-') << "\n";
  }
  for (const auto& r : rows) line(r);
}

namespace {

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The bytes a sequence led by `lead` has (0: `lead` starts none) and the range of its second
// byte (Unicode Table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF).
int sequence_length(unsigned char lead, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead == 0xE0) lo = 0xA0;
  if (lead == 0xED) hi = 0x9F;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead == 0xF0) lo = 0x90;
  if (lead == 0xF4) hi = 0x8F;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

std::string Utf8Stream::push(const std::string& bytes) {
  pending_ += bytes;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const auto lead = static_cast<unsigned char>(pending_[i]);
    unsigned char lo = 0, hi = 0;
    const int n = sequence_length(lead, lo, hi);
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    int k = 1;
    for (; k < n && i + static_cast<size_t>(k) < pending_.size(); ++k) {
      const auto b = static_cast<unsigned char>(pending_[i + static_cast<size_t>(k)]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
    }
    if (k == n) {
      out.append(pending_, i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else if (i + static_cast<size_t>(k) == pending_.size()) {
      break;  // a character still arriving
    } else {
      out += kReplacement;  // the maximal subpart k bytes long, then the byte that broke it
      i += static_cast<size_t>(k);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  const bool unfinished = !pending_.empty();
  pending_.clear();
  return unfinished ? kReplacement : "";
}

}  // namespace diffattn
