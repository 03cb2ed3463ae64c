// The rendering library: PNG files decoded back (chunk CRCs, zlib stream, every pixel), .npy
// headers, atomic writes, colour maps centred on zero, ticks and labels.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "diffattn/viz/viz.h"
#include "temp_dir.h"

namespace diffattn::viz {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

// A minimal PNG reader for what the writer produces (8-bit RGB, filter 0): checks the signature,
// every chunk's CRC and returns the pixels.
std::vector<uint8_t> decode_png(const std::string& png, int& w, int& h) {
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  size_t at = 8;
  bool ended = false;
  while (at + 12 <= png.size()) {
    const uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    const std::string data = png.substr(at + 8, len);
    const uint32_t crc = be32(png, at + 8 + len);
    const std::string td = type + data;
    EXPECT_EQ(crc, crc32(0L, reinterpret_cast<const Bytef*>(td.data()), td.size())) << type;
    if (type == "IHDR") {
      w = static_cast<int>(be32(data, 0));
      h = static_cast<int>(be32(data, 4));
      EXPECT_EQ(data[8], 8);  // bit depth
      EXPECT_EQ(data[9], 2);  // RGB
    } else if (type == "IDAT") {
      idat += data;
    } else if (type == "IEND") {
      ended = true;
    }
    at += 12 + len;
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(at, png.size());
  uLongf raw_len = static_cast<uLongf>(h) * (1 + 3 * w);
  std::vector<uint8_t> raw(raw_len);
  EXPECT_EQ(uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()),
                       idat.size()),
            Z_OK);
  std::vector<uint8_t> px;
  for (int y = 0; y < h; ++y) {
    EXPECT_EQ(raw[y * (1 + 3 * w)], 0);  // filter none
    px.insert(px.end(), raw.begin() + y * (1 + 3 * w) + 1, raw.begin() + (y + 1) * (1 + 3 * w));
  }
  return px;
}

int count_entries(const std::string& dir) {
  int n = 0;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

TEST(Png, RoundTripsEveryPixel) {
  Canvas c(37, 11, Rgb{10, 20, 30});
  c.set(0, 0, Rgb{255, 0, 0});
  c.set(36, 10, Rgb{0, 255, 0});
  c.fill_rect(5, 3, 4, 2, Rgb{1, 2, 3});
  const diffattn::testing::TempDir tmp("diffattn_viz");
  const std::string dir = tmp.str();
  write_png(dir + "/a.png", c);
  int w = 0, h = 0;
  const std::vector<uint8_t> px = decode_png(read_file(dir + "/a.png"), w, h);
  ASSERT_EQ(w, 37);
  ASSERT_EQ(h, 11);
  EXPECT_EQ(px, c.pixels());
  EXPECT_EQ(count_entries(dir), 1) << "the temporary file must be gone";
}

TEST(Files, AtomicWriteReplacesAndFailsClearly) {
  const diffattn::testing::TempDir tmp("diffattn_viz");
  const std::string dir = tmp.str();
  write_file_atomic(dir + "/f", "first");
  write_file_atomic(dir + "/f", "second");
  EXPECT_EQ(read_file(dir + "/f"), "second");
  EXPECT_EQ(count_entries(dir), 1);
  try {
    write_file_atomic(dir + "/missing/f", "x");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/missing/f"), std::string::npos) << e.what();
  }
  make_dirs(dir + "/x/y/z");
  write_file_atomic(dir + "/x/y/z/g", "ok");
  EXPECT_EQ(read_file(dir + "/x/y/z/g"), "ok");
  EXPECT_THROW(make_dirs(dir + "/f/sub"), IoError);
}

TEST(Npy, HeaderIsAlignedAndDescribesTheArray) {
  const float v[6] = {1, 2, 3, 4, 5, 6};
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{2, 3}, std::vector<int64_t>{6}, std::vector<int64_t>{1, 2, 3}}) {
    const std::string npy = encode_npy(v, shape);
    EXPECT_EQ(npy.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const size_t hlen = uint8_t(npy[8]) | (uint8_t(npy[9]) << 8);
    EXPECT_EQ((10 + hlen) % 64, 0u);
    const std::string header = npy.substr(10, hlen);
    EXPECT_EQ(header.back(), '\n');
    EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos);
    EXPECT_NE(header.find("'fortran_order': False"), std::string::npos);
    EXPECT_EQ(npy.size(), 10 + hlen + sizeof v);
    EXPECT_EQ(std::memcmp(npy.data() + 10 + hlen, v, sizeof v), 0);
  }
  EXPECT_NE(encode_npy(v, {6}).find("'shape': (6,)"), std::string::npos);
  EXPECT_NE(encode_npy(v, {2, 3}).find("'shape': (2, 3)"), std::string::npos);
}

TEST(Colors, DivergingIsWhiteAtZeroAndSigned) {
  EXPECT_EQ(diverging_color(0.0), (Rgb{247, 247, 247}));
  const Rgb pos = diverging_color(1.0), neg = diverging_color(-1.0);
  EXPECT_GT(pos.r, pos.b);
  EXPECT_GT(neg.b, neg.r);
  const Rgb lo = sequential_color(0.0), hi = sequential_color(1.0);
  EXPECT_LT(lo.r + lo.g + lo.b, hi.r + hi.g + hi.b);  // dark to light
}

TEST(Heatmap, CellsCarryTheirColours) {
  // Signed 2x2: negative, zero, positive, larger positive; one cell per 40 pixels.
  const float m[4] = {-1.0f, 0.0f, 0.5f, 1.0f};
  HeatmapSpec spec;
  spec.title = "signed";
  spec.row_labels = {"a", "b"};
  spec.col_labels = {"c", "d"};
  spec.scale = ColorScale::Diverging;
  spec.cell_px = 40;
  spec.annotate = 0;
  const Canvas c = render_heatmap(m, 2, 2, spec);
  // Find the grid: the first pixel from the left on the middle of row 0 whose colour is blue.
  int gx = -1, gy = -1;
  for (int y = 0; y < c.height() && gx < 0; ++y) {
    for (int x = 0; x < c.width(); ++x) {
      if (c.at(x, y) == diverging_color(-1.0)) {
        gx = x;
        gy = y;
        break;
      }
    }
  }
  ASSERT_GE(gx, 0);
  EXPECT_EQ(c.at(gx + 20, gy + 20), diverging_color(-1.0));
  EXPECT_EQ(c.at(gx + 60, gy + 20), diverging_color(0.0));
  EXPECT_EQ(c.at(gx + 20, gy + 60), diverging_color(0.5));
  EXPECT_EQ(c.at(gx + 60, gy + 60), diverging_color(1.0));
  HeatmapSpec bad;
  bad.row_labels = {"one"};
  EXPECT_THROW(render_heatmap(m, 2, 2, bad), InvalidArgument);
}

// Lines of text between x0 and x1 in the pixel rows [y0, y1): bands of rows with ink (a dark
// pixel), a band ending at two blank rows (a glyph's own gaps, as over an "i", are one row).
int ink_bands(const Canvas& c, int x0, int x1, int y0, int y1) {
  int bands = 0, blank = 2;
  for (int y = y0; y < y1; ++y) {
    bool ink = false;
    for (int x = x0; x < x1 && !ink; ++x) {
      const Rgb p = c.at(x, y);
      ink = p.r + p.g + p.b < 3 * 128;
    }
    bands += ink && blank >= 2;
    blank = ink ? 0 : blank + 1;
  }
  return bands;
}

TEST(Heatmap, RowLabelsOfAFewRowsOfManyColumnsDoNotOverlap) {
  // The shape of the retrieval report's query_row.png: layers x heads rows, ~80 key columns, so
  // the cells are 6 px: too short for a line of label text.
  const int rows = 4, cols = 80;
  std::vector<float> m(rows * cols);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i % 7) / 7.0f;
  HeatmapSpec spec;
  spec.title = "query row";
  for (int r = 0; r < rows; ++r) spec.row_labels.push_back("layer " + std::to_string(r / 2) + " head " + std::to_string(r % 2));
  spec.row_axis = "layer, head";
  spec.annotate = 0;
  // The labels' left part (they are right-aligned, each about 60 px or wider): right of the
  // turned axis title, left of the grid; the grid's rows start at y = 37.
  const Canvas square = render_heatmap(m.data(), rows, cols, spec);
  // Every other label at most (6 px rows, 9 px text): each its own band of ink.
  EXPECT_EQ(ink_bands(square, 32, 60, 30, 37 + rows * 6 + 4), rows / 2);
  spec.row_px = 14;
  const Canvas tall = render_heatmap(m.data(), rows, cols, spec);
  EXPECT_EQ(ink_bands(tall, 32, 60, 30, 37 + rows * 14 + 4), rows);  // every label, apart
}

TEST(Chart, DrawsSeriesInsideTheAxes) {
  Series s;
  s.name = "line";
  s.x = {0, 1, 2};
  s.y = {0, 1, 4};
  ChartSpec spec;
  spec.title = "t";
  const Canvas c = render_line_chart({s}, spec);
  int coloured = 0;
  for (int y = 0; y < c.height(); ++y) {
    for (int x = 0; x < c.width(); ++x) coloured += c.at(x, y) == Rgb{31, 119, 180};
  }
  EXPECT_GT(coloured, 200);  // the 2-pixel line and its markers in the first palette colour
  Series bad;
  bad.x = {1};
  EXPECT_THROW(render_line_chart({bad}, spec), InvalidArgument);
}

TEST(Ticks, AreNiceAndCoverTheRange) {
  EXPECT_EQ(nice_ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  const std::vector<double> t = nice_ticks(-0.37, 0.81, 6);
  EXPECT_LE(t.front(), 0.0);
  EXPECT_GE(t.back(), 0.6);
  for (double v : t) EXPECT_TRUE(v >= -0.37 && v <= 0.81);
}

TEST(Labels, EscapeWhatCannotBeSeen) {
  EXPECT_EQ(display_label("cat"), "cat");
  EXPECT_EQ(display_label("a\nb"), "a\\nb");
  EXPECT_EQ(display_label(" the"), "\xc2\xb7the");
  EXPECT_EQ(display_label(std::string("\xff", 1)), "\\xff");
  EXPECT_EQ(display_label("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(display_label("abcdefghijklmnopqrstuvwxyz", 5), "abcde...");
}

TEST(Text, MeasuresAndDraws) {
  const TextSize s = measure_text("Hello", 14);
  EXPECT_GT(s.width, 20);
  EXPECT_GT(s.height, 10);
  Canvas c(100, 40);
  draw_text(c, 5, 30, "Hello", 14, kBlack);
  int dark = 0;
  for (int y = 0; y < 40; ++y) {
    for (int x = 0; x < 100; ++x) dark += c.at(x, y).r < 128;
  }
  EXPECT_GT(dark, 30);
}

}  // namespace
}  // namespace diffattn::viz
