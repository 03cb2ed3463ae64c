// Pictures and arrays for looking inside attention: an RGB canvas, text through FreeType with a
// Debian font, heatmaps (diverging colour map centred on zero for signed maps, sequential for
// probabilities) with token labels and a colour bar, line charts with axes, ticks and a legend,
// and writers for PNG and NumPy .npy files. Every file is written atomically (temporary file in
// the same directory, fsync, rename, fsync of the directory): a reader never sees half a file.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "diffattn/base/error.h"
#include "diffattn/base/files.h"

namespace diffattn::viz {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

inline constexpr Rgb kWhite{255, 255, 255};
inline constexpr Rgb kBlack{0, 0, 0};
inline constexpr Rgb kGrey{120, 120, 120};
inline constexpr Rgb kLightGrey{225, 225, 225};

// An 8-bit RGB image, row-major, top-left origin. Drawing clips at the edges.
class Canvas {
 public:
  Canvas(int width, int height, Rgb background = kWhite);

  int width() const { return w_; }
  int height() const { return h_; }
  const std::vector<uint8_t>& pixels() const { return px_; }  // (height, width, 3)
  Rgb at(int x, int y) const;

  void set(int x, int y, Rgb c);
  // Mixes c over the pixel with opacity alpha in [0, 1].
  void blend(int x, int y, Rgb c, float alpha);
  void fill_rect(int x, int y, int w, int h, Rgb c);
  void rect_outline(int x, int y, int w, int h, Rgb c);
  // An anti-aliased segment of the given width (pixels), optionally dashed.
  void line(double x0, double y0, double x1, double y1, Rgb c, double width = 1.0,
            double dash = 0.0);
  void disc(double cx, double cy, double radius, Rgb c);
  // Copies src with its top-left corner at (x, y).
  void blit(const Canvas& src, int x, int y);

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

// ---- text ----

enum class HAlign { Left, Center, Right };
enum class VAlign { Top, Middle, Baseline, Bottom };

// Width and height in pixels of a line of text at a pixel size (height is ascent + descent).
struct TextSize {
  int width = 0, height = 0, ascent = 0;
};

// Path of the font used for every label: $DIFFATTN_FONT if set, else DejaVu Sans from Debian's
// fonts-dejavu-core. Throws IoError naming the paths tried and the package when none exists.
std::string font_path();

TextSize measure_text(const std::string& utf8, int px);
// Draws one line of UTF-8 text anchored at (x, y). rotated: turned 90 degrees counter-clockwise
// (reads bottom to top), the anchor then refers to the turned box.
void draw_text(Canvas& c, int x, int y, const std::string& utf8, int px, Rgb color,
               HAlign h = HAlign::Left, VAlign v = VAlign::Baseline, bool rotated = false);

// A token as a label: control characters and invalid UTF-8 bytes become escapes (\n, \x0b),
// a leading or trailing space becomes a visible middle dot, long tokens are cut with "...".
std::string display_label(const std::string& token, size_t max_chars = 16);

// ---- colour maps ----

enum class ColorScale {
  Sequential,  // probabilities: 0 .. vmax, light to dark (viridis)
  Diverging,   // signed values: -m .. 0 .. +m, blue - white - red, white exactly at zero
};

// t in [0, 1]; NaN maps to grey.
Rgb sequential_color(double t);
// t in [-1, 1], 0 is white.
Rgb diverging_color(double t);

// ---- heatmaps ----

struct HeatmapSpec {
  std::string title;
  std::vector<std::string> row_labels, col_labels;  // empty: indices; shown when they fit
  std::string row_axis = "query", col_axis = "key";
  ColorScale scale = ColorScale::Sequential;
  // Colour range. NaN: automatic (sequential: [0, max]; diverging: [-m, m], m = max |value|).
  double vmin = std::numeric_limits<double>::quiet_NaN();
  double vmax = std::numeric_limits<double>::quiet_NaN();
  int cell_px = 0;         // 0: chosen from the size (large maps get 1-2 px cells)
  int row_px = 0;          // rows at least this tall (a few rows of many columns); 0: square cells
  int annotate = -1;       // write values in cells: -1 auto (when cells are large), 0 no, 1 yes
};

// A (rows, cols) row-major matrix as a heatmap with title, axis labels and a colour bar.
// Throws InvalidArgument for an empty matrix or label counts that do not match.
Canvas render_heatmap(const float* data, int rows, int cols, const HeatmapSpec& spec);

// Panels side by side (wrapping after `per_row`), on a white page with an optional title.
Canvas compose(const std::vector<Canvas>& panels, int per_row, const std::string& title = "");

// ---- line charts ----

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; NaN y values leave a gap
  Rgb color{0, 0, 0};
  bool auto_color = true;    // take the next colour of the palette
  bool markers = true;
  bool dashed = false;
};

struct VLine {
  double x = 0;
  std::string label;
};

struct ChartSpec {
  std::string title, x_label, y_label;
  int width = 820, height = 520;
  bool log_x = false, log_y = false;
  double ymin = std::numeric_limits<double>::quiet_NaN();  // NaN: from the data
  double ymax = std::numeric_limits<double>::quiet_NaN();
  std::vector<VLine> vlines;  // labelled vertical markers (e.g. a crossover)
};

Canvas render_line_chart(const std::vector<Series>& series, const ChartSpec& spec);

// "Nice" tick values (1, 2, 5 times a power of ten) covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

// ---- files ----

// Atomic writes and directories: include/diffattn/base/files.h.
using diffattn::make_dirs;
using diffattn::write_file_atomic;
// The PNG encoding of a canvas (8-bit RGB, zlib), and writing it.
std::string encode_png(const Canvas& c);
void write_png(const std::string& path, const Canvas& c);
// A NumPy .npy file (format 1.0, little-endian float32, C order) of the given shape.
std::string encode_npy(const float* data, const std::vector<int64_t>& shape);
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);

}  // namespace diffattn::viz
