// Text output (include/diffattn/base/text.h): Markdown tables whose cells hold "|", and bytes
// streamed out as whole, valid UTF-8 characters (what `diffattn generate` prints).
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "diffattn/base/text.h"

namespace diffattn {
namespace {

// Every byte pushed on its own, then finish(): what a byte-level model's stream prints.
std::string stream_bytes(const std::string& bytes) {
  Utf8Stream s;
  std::string out;
  for (char c : bytes) out += s.push(std::string(1, c));
  return out + s.finish();
}

std::string stream_whole(const std::string& bytes) {
  Utf8Stream s;
  const std::string out = s.push(bytes);  // before finish(): the operands of + are unordered
  return out + s.finish();
}

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Stream, ValidTextIsUnchangedWhateverThePieces) {
  const std::string text = "plain ASCII, caf\xC3\xA9, \xE2\x82\xAC 5, \xF0\x9F\x98\x80!";
  EXPECT_EQ(stream_bytes(text), text);
  EXPECT_EQ(stream_whole(text), text);
  Utf8Stream s;
  EXPECT_EQ(s.push("caf\xC3"), "caf");  // the e-acute waits for its second byte
  EXPECT_EQ(s.push("\xA9"), "\xC3\xA9");
  EXPECT_EQ(s.push("\xF0\x9F"), "");
  EXPECT_EQ(s.push("\x98"), "");
  EXPECT_EQ(s.push("\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.finish(), "");
}

TEST(Utf8Stream, InvalidBytesBecomeOneReplacementPerMaximalSubpart) {
  // Expected values are Python's bytes.decode("utf-8", errors="replace").
  EXPECT_EQ(stream_bytes("a\x80" "b"), "a" + kFffd + "b");               // a lone continuation
  EXPECT_EQ(stream_bytes("\xC3" "b"), kFffd + "b");                      // a lead, then ASCII
  EXPECT_EQ(stream_bytes("\xE2\x82" "b"), kFffd + "b");                  // 2 of 3 bytes: one U+FFFD
  EXPECT_EQ(stream_bytes("\xC0\xAF"), kFffd + kFffd);                    // overlong: never a lead
  EXPECT_EQ(stream_bytes("\xED\xA0\x80"), kFffd + kFffd + kFffd);        // a surrogate
  EXPECT_EQ(stream_bytes("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
  EXPECT_EQ(stream_bytes("\xFF"), kFffd);
  EXPECT_EQ(stream_whole("\xE2\x82" "b\xC3"), kFffd + "b" + kFffd);
}

TEST(Utf8Stream, AnUnfinishedCharacterAtTheEndIsOneReplacement) {
  Utf8Stream s;
  EXPECT_EQ(s.push("ok \xF0\x9F\x98"), "ok ");
  EXPECT_EQ(s.finish(), kFffd);
  EXPECT_EQ(s.finish(), "");  // nothing left
}

TEST(PrintTable, MarkdownEscapesPipesInCells) {
  std::ostringstream os;
  print_table(os, {"map", "noise |w|"}, {{"A1 | A2", "0.5"}}, TableStyle::Markdown);
  const std::string md = os.str();
  EXPECT_NE(md.find("noise \\|w\\|"), std::string::npos) << md;
  EXPECT_NE(md.find("A1 \\| A2"), std::string::npos) << md;
  // Every line has 3 unescaped pipes: 2 columns.
  std::istringstream in(md);
  for (std::string line; std::getline(in, line);) {
    int pipes = 0;
    for (size_t i = 0; i < line.size(); ++i) pipes += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    EXPECT_EQ(pipes, 3) << line;
  }
  // Plain text keeps the cell as it is.
  std::ostringstream plain;
  print_table(plain, {"map", "noise |w|"}, {{"x", "1"}}, TableStyle::Ruled);
  EXPECT_NE(plain.str().find("noise |w|"), std::string::npos);
}

}  // namespace
}  // namespace diffattn
