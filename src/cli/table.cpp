// Implementation of the plain-text tables (see table.h).
#include "cli/table.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace diffattn::cli {

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
