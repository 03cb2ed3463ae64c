// Plain-text tables for the tool's output: labelled matrices with fixed decimals, as the
// textbook lays them out.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace diffattn::cli {

// Prints a (rows x cols) row-major matrix with row and column labels, `decimals` places,
// optional title line; negative values keep their sign.
void print_matrix(std::ostream& os, const std::string& title, const std::vector<std::string>& rows,
                  const std::vector<std::string>& cols, const float* data, int decimals = 4);

// A table of strings with a header row; columns are right-aligned except the first.
void print_table(std::ostream& os, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows);

std::string fixed(double v, int decimals = 4);

}  // namespace diffattn::cli
