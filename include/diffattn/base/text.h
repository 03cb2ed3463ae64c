// Text output shared by the tool and the reports: fixed-decimal numbers and tables whose first
// column is left-aligned and the others right-aligned, as plain text, plain text with a rule
// under the header, or Markdown.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace diffattn {

// `decimals` places; "-0.00" prints as "0.00".
std::string fixed(double v, int decimals = 4);

enum class TableStyle { Plain, Ruled, Markdown };

void print_table(std::ostream& os, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows,
                 TableStyle style = TableStyle::Plain);

}  // namespace diffattn
