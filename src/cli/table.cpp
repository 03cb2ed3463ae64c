// Implementation of the plain-text tables (see table.h).
#include "cli/table.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace diffattn::cli {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  // "-0.0000" reads as a sign error; print it as zero.
  if (s.find_first_not_of("-0.") == std::string::npos && s[0] == '-') s.erase(0, 1);
  return s;
}

void print_table(std::ostream& os, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      const std::string pad(width[c] - std::min(width[c], cell.size()), ' ');
      os << (c ? "  " : "") << (c == 0 ? cell + pad : pad + cell);
    }
    os << '\n';
  };
  line(header);
  for (const auto& r : rows) line(r);
}

void print_matrix(std::ostream& os, const std::string& title, const std::vector<std::string>& rows,
                  const std::vector<std::string>& cols, const float* data, int decimals) {
  if (!title.empty()) os << title << '\n';
  std::vector<std::string> header{""};
  header.insert(header.end(), cols.begin(), cols.end());
  std::vector<std::vector<std::string>> body;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<std::string> r{rows[i]};
    for (size_t j = 0; j < cols.size(); ++j) r.push_back(fixed(data[i * cols.size() + j], decimals));
    body.push_back(r);
  }
  print_table(os, header, body);
}

}  // namespace diffattn::cli
