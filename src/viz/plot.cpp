// Colour maps, heatmaps and line charts drawn on the canvas. Layout is computed from measured
// text, so labels never overlap the plot; large matrices shrink to 1-2 pixel cells and show
// index ticks instead of token labels.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "diffattn/viz/viz.h"

namespace diffattn::viz {

namespace {

Rgb lerp(Rgb a, Rgb b, double t) {
  auto m = [t](uint8_t x, uint8_t y) { return static_cast<uint8_t>(std::lround(x + (y - x) * t)); };
  return {m(a.r, b.r), m(a.g, b.g), m(a.b, b.b)};
}

Rgb ramp(const Rgb* stops, int n, double t) {
  t = std::clamp(t, 0.0, 1.0) * (n - 1);
  const int i = std::min(static_cast<int>(t), n - 2);
  return lerp(stops[i], stops[i + 1], t - i);
}

// Anchors of matplotlib's viridis (perceptually uniform, readable in grey and for colour-blind
// readers) and of ColorBrewer's RdBu, reversed so that positive is red.
constexpr Rgb kViridis[] = {{68, 1, 84},    {72, 40, 120},  {62, 73, 137},  {49, 104, 142},
                            {38, 130, 142}, {31, 158, 137}, {53, 183, 121}, {110, 206, 88},
                            {181, 222, 43}, {253, 231, 37}};
constexpr Rgb kBlueWhiteRed[] = {{33, 102, 172},  {103, 169, 207}, {209, 229, 240}, {247, 247, 247},
                                 {253, 219, 199}, {239, 138, 98},  {178, 24, 43}};

constexpr Rgb kPalette[] = {{31, 119, 180}, {214, 39, 40},  {44, 160, 44},  {255, 127, 14},
                            {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {127, 127, 127}};

std::string short_num(double v) {
  if (v == 0) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

double luminance(Rgb c) { return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b; }

}  // namespace

Rgb sequential_color(double t) {
  if (std::isnan(t)) return kGrey;
  return ramp(kViridis, 10, t);
}

Rgb diverging_color(double t) {
  if (std::isnan(t)) return kGrey;
  // Stop 3 of 7 is the white centre: t = 0 lands on it exactly.
  return ramp(kBlueWhiteRed, 7, (std::clamp(t, -1.0, 1.0) + 1.0) / 2.0);
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

Canvas render_heatmap(const float* data, int rows, int cols, const HeatmapSpec& spec) {
  if (rows <= 0 || cols <= 0) {
    throw InvalidArgument("heatmap \"" + spec.title + "\": matrix is empty (" +
                          std::to_string(rows) + "x" + std::to_string(cols) + ")");
  }
  if (!spec.row_labels.empty() && static_cast<int>(spec.row_labels.size()) != rows) {
    throw InvalidArgument("heatmap \"" + spec.title + "\": " +
                          std::to_string(spec.row_labels.size()) + " row labels for " +
                          std::to_string(rows) + " rows");
  }
  if (!spec.col_labels.empty() && static_cast<int>(spec.col_labels.size()) != cols) {
    throw InvalidArgument("heatmap \"" + spec.title + "\": " +
                          std::to_string(spec.col_labels.size()) + " column labels for " +
                          std::to_string(cols) + " columns");
  }
  const int n = std::max(rows, cols);
  const int cell = spec.cell_px > 0 ? spec.cell_px : std::clamp(480 / n, 1, 56);
  // Row height: the cell's, or taller (spec.row_px) so that few rows of many columns keep
  // readable labels.
  const int ch = std::max(cell, spec.row_px);
  const bool diverging = spec.scale == ColorScale::Diverging;

  double lo = spec.vmin, hi = spec.vmax;
  double dmin = INFINITY, dmax = -INFINITY;
  for (int64_t i = 0; i < static_cast<int64_t>(rows) * cols; ++i) {
    if (std::isfinite(data[i])) {
      dmin = std::min<double>(dmin, data[i]);
      dmax = std::max<double>(dmax, data[i]);
    }
  }
  if (!std::isfinite(dmin)) dmin = dmax = 0;
  if (diverging) {
    const double m = std::max(std::abs(dmin), std::abs(dmax));
    if (std::isnan(hi)) hi = m > 0 ? m : 1.0;
    if (std::isnan(lo)) lo = -hi;
  } else {
    if (std::isnan(lo)) lo = std::min(0.0, dmin);
    if (std::isnan(hi)) hi = dmax > lo ? dmax : lo + 1.0;
  }

  // Labels: token labels when the cells are tall enough to hold a line of text.
  const int label_px = std::clamp(cell - 4, 9, 13);
  // Small cells show every k-th label only (see label_step), each with its index.
  const bool show_rows = true, show_cols = true;
  std::vector<std::string> rl(rows), cl(cols);
  auto label = [](const std::vector<std::string>& labels, int i, bool indexed) {
    if (labels.empty()) return std::to_string(i);
    return indexed ? std::to_string(i) + " " + display_label(labels[i], 10) : display_label(labels[i]);
  };
  for (int i = 0; i < rows; ++i) rl[i] = label(spec.row_labels, i, ch < 10);
  for (int j = 0; j < cols; ++j) cl[j] = label(spec.col_labels, j, cell < 10);
  // Index ticks for small cells: every k-th row or column (a 1-2-5 step) so labels do not
  // collide: at most about 6 labels, and never closer than a line of label text.
  auto label_step = [label_px](int count, int px) {
    if (px >= 10) return 1;
    const std::vector<double> t = nice_ticks(0, count, 6);
    int k = t.size() > 1 ? std::max(1, static_cast<int>(t[1] - t[0])) : count;
    for (int m = 0; k * px < label_px + 2; ++m) k = (m % 3 == 1 ? 5 * k / 2 : 2 * k);  // 1, 2, 5, 10, ...
    return k;
  };
  const int every_r = label_step(rows, ch), every_c = label_step(cols, cell);
  int row_label_w = 0, col_label_h = 0;
  for (int i = 0; i < rows; i += every_r) {
    if (show_rows) row_label_w = std::max(row_label_w, measure_text(rl[i], label_px).width);
  }
  for (int j = 0; j < cols; j += every_c) {
    if (show_cols) col_label_h = std::max(col_label_h, measure_text(cl[j], label_px).width);
  }

  const int title_px = 15, axis_px = 12;
  const int pad = 10;
  const int gx = pad + axis_px + 8 + row_label_w + 6;  // grid left
  const int gy = pad + title_px + 12;                 // grid top
  const int gw = cell * cols, gh = ch * rows;
  const int bar_x = gx + gw + 18, bar_w = 14;
  std::vector<double> bar_ticks = nice_ticks(lo, hi, 5);
  int bar_label_w = 0;
  for (double t : bar_ticks) bar_label_w = std::max(bar_label_w, measure_text(short_num(t), 11).width);
  const int width = bar_x + bar_w + 6 + bar_label_w + pad;
  const int height = gy + std::max(gh, 120) + 6 + col_label_h + 8 + axis_px + pad + 4;
  const int title_w = measure_text(spec.title, title_px).width + 2 * pad;
  Canvas c(std::max(width, title_w), height);

  draw_text(c, pad, pad, spec.title, title_px, kBlack, HAlign::Left, VAlign::Top);
  // Cells.
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      const double v = data[static_cast<int64_t>(i) * cols + j];
      Rgb col;
      if (!std::isfinite(v)) {
        col = kGrey;
      } else if (diverging) {
        col = diverging_color(v >= 0 ? v / hi : -v / lo);
      } else {
        col = sequential_color((v - lo) / (hi - lo));
      }
      c.fill_rect(gx + j * cell, gy + i * ch, cell, ch, col);
    }
  }
  const bool annotate = spec.annotate == 1 || (spec.annotate == -1 && cell >= 36);
  if (annotate) {
    const int vpx = std::clamp(cell / 4, 9, 12);
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        const double v = data[static_cast<int64_t>(i) * cols + j];
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.3f", v);
        std::string s = buf;
        if (s == "-0.000") s = "0.000";
        const Rgb under = c.at(gx + j * cell + cell / 2, gy + i * ch + ch / 2);
        draw_text(c, gx + j * cell + cell / 2, gy + i * ch + ch / 2, s, vpx,
                  luminance(under) < 128 ? kWhite : kBlack, HAlign::Center, VAlign::Middle);
      }
    }
  }
  c.rect_outline(gx - 1, gy - 1, gw + 2, gh + 2, kGrey);
  // Row labels (queries) to the left, column labels (keys) below, turned.
  for (int i = 0; show_rows && i < rows; i += every_r) {
    draw_text(c, gx - 6, gy + i * ch + ch / 2, rl[i], label_px, kBlack, HAlign::Right,
              VAlign::Middle);
  }
  for (int j = 0; show_cols && j < cols; j += every_c) {
    draw_text(c, gx + j * cell + cell / 2, gy + gh + 6, cl[j], label_px, kBlack, HAlign::Center,
              VAlign::Top, /*rotated=*/true);
  }
  draw_text(c, pad, gy + gh / 2, spec.row_axis, axis_px, kGrey, HAlign::Left, VAlign::Middle, true);
  draw_text(c, gx + gw / 2, gy + gh + 6 + col_label_h + 6, spec.col_axis, axis_px, kGrey,
            HAlign::Center, VAlign::Top);
  // Colour bar: top is hi, bottom lo.
  const int bar_h = std::max(gh, 120);
  for (int y = 0; y < bar_h; ++y) {
    const double v = hi - (hi - lo) * (y + 0.5) / bar_h;
    const Rgb col = diverging ? diverging_color(v >= 0 ? v / hi : -v / lo)
                              : sequential_color((v - lo) / (hi - lo));
    c.fill_rect(bar_x, gy + y, bar_w, 1, col);
  }
  c.rect_outline(bar_x - 1, gy - 1, bar_w + 2, bar_h + 2, kGrey);
  for (double t : bar_ticks) {
    const int y = gy + static_cast<int>(std::lround((hi - t) / (hi - lo) * bar_h));
    c.fill_rect(bar_x + bar_w, y, 3, 1, kBlack);
    draw_text(c, bar_x + bar_w + 5, y, short_num(t), 11, kBlack, HAlign::Left, VAlign::Middle);
  }
  return c;
}

Canvas compose(const std::vector<Canvas>& panels, int per_row, const std::string& title) {
  if (panels.empty()) throw InvalidArgument("compose: no panels");
  per_row = std::max(per_row, 1);
  const int gap = 12, title_h = title.empty() ? 0 : 34;
  std::vector<int> col_w(static_cast<size_t>(per_row), 0), row_h;
  for (size_t i = 0; i < panels.size(); ++i) {
    const size_t r = i / per_row, col = i % per_row;
    if (row_h.size() <= r) row_h.push_back(0);
    col_w[col] = std::max(col_w[col], panels[i].width());
    row_h[r] = std::max(row_h[r], panels[i].height());
  }
  int w = gap, h = title_h + gap;
  for (int cw : col_w) w += cw + gap;
  for (int rh : row_h) h += rh + gap;
  Canvas page(w, h);
  if (!title.empty()) draw_text(page, gap, gap, title, 17, kBlack, HAlign::Left, VAlign::Top);
  int y = title_h + gap;
  for (size_t r = 0; r < row_h.size(); ++r) {
    int x = gap;
    for (int col = 0; col < per_row; ++col) {
      const size_t i = r * per_row + col;
      if (i < panels.size()) page.blit(panels[i], x, y);
      x += col_w[col] + gap;
    }
    y += row_h[r] + gap;
  }
  return page;
}

Canvas render_line_chart(const std::vector<Series>& series, const ChartSpec& spec) {
  if (series.empty()) throw InvalidArgument("line chart \"" + spec.title + "\": no series");
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series) {
    if (s.x.size() != s.y.size()) {
      throw InvalidArgument("line chart \"" + spec.title + "\": series \"" + s.name + "\" has " +
                            std::to_string(s.x.size()) + " x values and " +
                            std::to_string(s.y.size()) + " y values");
    }
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      if (spec.log_x && s.x[i] <= 0) continue;
      if (spec.log_y && s.y[i] <= 0) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  }
  if (!std::isfinite(x0)) {
    x0 = spec.log_x ? 1 : 0;
    x1 = x0 + 1;
    y0 = spec.log_y ? 1 : 0;
    y1 = y0 + 1;
  }
  for (const VLine& v : spec.vlines) {
    if (std::isfinite(v.x) && (!spec.log_x || v.x > 0)) {
      x0 = std::min(x0, v.x);
      x1 = std::max(x1, v.x);
    }
  }
  if (!std::isnan(spec.ymin)) y0 = spec.ymin;
  if (!std::isnan(spec.ymax)) y1 = spec.ymax;
  auto tx = [&](double v) { return spec.log_x ? std::log10(v) : v; };
  auto ty = [&](double v) { return spec.log_y ? std::log10(v) : v; };
  double ax0 = tx(x0), ax1 = tx(x1), ay0 = ty(y0), ay1 = ty(y1);
  if (ax1 - ax0 < 1e-12) { ax0 -= 0.5; ax1 += 0.5; }
  if (ay1 - ay0 < 1e-12) { ay0 -= 0.5; ay1 += 0.5; }
  if (std::isnan(spec.ymin) && std::isnan(spec.ymax)) {
    const double m = (ay1 - ay0) * 0.05;  // a little air above and below the data
    ay0 -= m;
    ay1 += m;
  }

  // Ticks: decades (1, 2, 5 within) on log axes, 1-2-5 steps on linear ones.
  auto ticks_for = [](bool log, double a0, double a1) {
    std::vector<double> t;
    if (!log) return nice_ticks(a0, a1, 6);
    // Less than a decade or so: plain 1-2-5 steps between the end values read better.
    if (a1 - a0 < 0.7) {
      for (double v : nice_ticks(std::pow(10.0, a0), std::pow(10.0, a1), 5)) {
        if (v > 0) t.push_back(v);
      }
      return t;
    }
    const bool fine = a1 - a0 < 2.5;
    for (int e = static_cast<int>(std::floor(a0)); e <= static_cast<int>(std::ceil(a1)); ++e) {
      for (double m : fine ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
        const double v = m * std::pow(10.0, e);
        if (std::log10(v) >= a0 - 1e-9 && std::log10(v) <= a1 + 1e-9) t.push_back(v);
      }
    }
    return t;
  };
  const std::vector<double> xt = ticks_for(spec.log_x, ax0, ax1);
  const std::vector<double> yt = ticks_for(spec.log_y, ay0, ay1);

  const int tick_px = 11, label_px = 13, title_px = 15;
  int ylab_w = 0;
  for (double v : yt) ylab_w = std::max(ylab_w, measure_text(short_num(v), tick_px).width);
  const int left = 12 + label_px + 10 + ylab_w + 8, top = 14 + title_px + 14;
  const int right = 20, bottom = 12 + tick_px + 10 + label_px + 12;
  Canvas c(spec.width, spec.height);
  const int pw = spec.width - left - right, ph = spec.height - top - bottom;
  if (pw < 50 || ph < 50) throw InvalidArgument("line chart: too small for its labels");
  auto px = [&](double v) { return left + (tx(v) - ax0) / (ax1 - ax0) * pw; };
  auto py = [&](double v) { return top + ph - (ty(v) - ay0) / (ay1 - ay0) * ph; };

  draw_text(c, left, 14, spec.title, title_px, kBlack, HAlign::Left, VAlign::Top);
  for (double v : xt) {
    const double x = px(v);
    c.line(x, top, x, top + ph, kLightGrey, 1.0);
    c.line(x, top + ph, x, top + ph + 4, kBlack, 1.0);
    draw_text(c, static_cast<int>(x), top + ph + 7, short_num(v), tick_px, kBlack, HAlign::Center,
              VAlign::Top);
  }
  for (double v : yt) {
    const double y = py(v);
    c.line(left, y, left + pw, y, kLightGrey, 1.0);
    c.line(left - 4, y, left, y, kBlack, 1.0);
    draw_text(c, left - 7, static_cast<int>(y), short_num(v), tick_px, kBlack, HAlign::Right,
              VAlign::Middle);
  }
  c.rect_outline(left, top, pw + 1, ph + 1, kBlack);
  draw_text(c, left + pw / 2, spec.height - 12, spec.x_label, label_px, kBlack, HAlign::Center,
            VAlign::Bottom);
  draw_text(c, 12, top + ph / 2, spec.y_label, label_px, kBlack, HAlign::Left, VAlign::Middle,
            true);

  // Series, clipped to the plot rectangle by drawing only segments whose ends are inside the
  // axis range (the y range may be fixed by the caller).
  auto inside = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!spec.log_x || x > 0) &&
           (!spec.log_y || y > 0) && ty(y) >= ay0 - 1e-9 && ty(y) <= ay1 + 1e-9;
  };
  size_t next_color = 0;
  std::vector<Rgb> colors;
  for (const Series& s : series) {
    const Rgb col = s.auto_color ? kPalette[next_color++ % 8] : s.color;
    colors.push_back(col);
    for (size_t i = 1; i < s.x.size(); ++i) {
      if (inside(s.x[i - 1], s.y[i - 1]) && inside(s.x[i], s.y[i])) {
        c.line(px(s.x[i - 1]), py(s.y[i - 1]), px(s.x[i]), py(s.y[i]), col, 2.0,
               s.dashed ? 6.0 : 0.0);
      }
    }
    if (s.markers) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (inside(s.x[i], s.y[i])) c.disc(px(s.x[i]), py(s.y[i]), 3.0, col);
      }
    }
  }
  for (const VLine& v : spec.vlines) {
    if (!std::isfinite(v.x) || (spec.log_x && v.x <= 0)) continue;
    c.line(px(v.x), top, px(v.x), top + ph, kGrey, 1.5, 4.0);
    draw_text(c, static_cast<int>(px(v.x)) + 4, top + 4, v.label, tick_px, kGrey, HAlign::Left,
              VAlign::Top);
  }
  // Legend in the corner of the plot that covers the fewest data points (and marker labels).
  int lw = 0;
  for (const Series& s : series) lw = std::max(lw, measure_text(s.name, tick_px).width);
  const int row_h = tick_px + 7;
  const int lh = static_cast<int>(series.size()) * row_h + 8, lbw = lw + 36;
  int lx = left + pw - lbw - 8, ly = top + 8;
  int best = -1;
  for (int corner = 0; corner < 4; ++corner) {
    const int cx = corner % 2 ? left + 8 : left + pw - lbw - 8;
    const int cy = corner / 2 ? top + ph - lh - 8 : top + 8;
    int hits = 0;
    for (const Series& s : series) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!inside(s.x[i], s.y[i])) continue;
        const double X = px(s.x[i]), Y = py(s.y[i]);
        hits += X >= cx && X <= cx + lbw && Y >= cy && Y <= cy + lh;
      }
    }
    for (const VLine& v : spec.vlines) {
      if (std::isfinite(v.x) && (!spec.log_x || v.x > 0)) {
        const double X = px(v.x);
        const int label_w = measure_text(v.label, tick_px).width;
        if (X + label_w + 4 >= cx && X <= cx + lbw) hits += cy < top + 30 ? 1000 : 10;
      }
    }
    if (best < 0 || hits < best) {
      best = hits;
      lx = cx;
      ly = cy;
    }
  }
  c.fill_rect(lx, ly, lbw, lh, kWhite);
  c.rect_outline(lx, ly, lbw, lh, kGrey);
  for (size_t i = 0; i < series.size(); ++i) {
    const int y = ly + 4 + static_cast<int>(i) * row_h + row_h / 2;
    c.line(lx + 6, y, lx + 24, y, colors[i], 2.0, series[i].dashed ? 4.0 : 0.0);
    if (series[i].markers) c.disc(lx + 15, y, 3.0, colors[i]);
    draw_text(c, lx + 30, y, series[i].name, tick_px, kBlack, HAlign::Left, VAlign::Middle);
  }
  return c;
}

}  // namespace diffattn::viz
