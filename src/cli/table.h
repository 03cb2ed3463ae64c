// Plain-text tables for the tool's output: labelled matrices with fixed decimals, as the
// textbook lays them out.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "diffattn/base/text.h"

namespace diffattn::cli {

// Prints a (rows x cols) row-major matrix with row and column labels, `decimals` places,
// optional title line; negative values keep their sign.
void print_matrix(std::ostream& os, const std::string& title, const std::vector<std::string>& rows,
                  const std::vector<std::string>& cols, const float* data, int decimals = 4);

// Tables of strings and fixed-decimal numbers: include/diffattn/base/text.h.
using diffattn::fixed;
using diffattn::print_table;

}  // namespace diffattn::cli
