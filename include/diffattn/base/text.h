// Text output shared by the tool and the reports: fixed-decimal numbers and tables whose first
// column is left-aligned and the others right-aligned, as plain text, plain text with a rule
// under the header, or Markdown; bytes streamed out as whole, valid UTF-8 characters.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace diffattn {

// `decimals` places; "-0.00" prints as "0.00".
std::string fixed(double v, int decimals = 4);

// "1 token", "2 tokens": n and the noun, with an "s" unless n is 1.
std::string plural(long long n, const std::string& noun);

enum class TableStyle { Plain, Ruled, Markdown };

// Markdown cells have their "|" escaped ("noise |w|" is one cell, not two).
void print_table(std::ostream& os, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows,
                 TableStyle style = TableStyle::Plain);

// Bytes that arrive in pieces (a byte-level model's tokens, a BPE token holding part of a
// character) as valid UTF-8 to print piece by piece: push() returns the whole characters
// complete so far (a character split across pushes waits for its last byte) with every invalid
// sequence replaced by U+FFFD, one per maximal ill-formed subpart (as Unicode's "U+FFFD
// substitution of maximal subparts" and Python's errors="replace" do); finish() returns what
// is left, U+FFFD for a character that never completed.
class Utf8Stream {
 public:
  std::string push(const std::string& bytes);
  std::string finish();

 private:
  std::string pending_;
};

}  // namespace diffattn
