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

void print_table(std::ostream& os, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows, TableStyle style) {
  const bool md = style == TableStyle::Markdown;
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

}  // namespace diffattn
