// The RGB canvas: pixels, rectangles, anti-aliased segments and discs. Coverage of a segment is
// computed from each pixel centre's distance to it, so lines look the same at any angle.
#include <algorithm>
#include <cmath>

#include "diffattn/viz/viz.h"

namespace diffattn::viz {

Canvas::Canvas(int width, int height, Rgb background) : w_(width), h_(height) {
  if (width <= 0 || height <= 0 || width > 16384 || height > 16384) {
    throw InvalidArgument("canvas: size must be 1..16384 pixels a side, got " +
                          std::to_string(width) + "x" + std::to_string(height));
  }
  px_.resize(static_cast<size_t>(w_) * h_ * 3);
  for (size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = background.r;
    px_[i + 1] = background.g;
    px_[i + 2] = background.b;
  }
}

Rgb Canvas::at(int x, int y) const {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return kWhite;
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  return {px_[i], px_[i + 1], px_[i + 2]};
}

void Canvas::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  px_[i] = c.r;
  px_[i + 1] = c.g;
  px_[i + 2] = c.b;
}

void Canvas::blend(int x, int y, Rgb c, float alpha) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_ || !(alpha > 0.0f)) return;
  alpha = std::min(alpha, 1.0f);
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  auto mix = [alpha](uint8_t under, uint8_t over) {
    return static_cast<uint8_t>(std::lround(under + (over - under) * alpha));
  };
  px_[i] = mix(px_[i], c.r);
  px_[i + 1] = mix(px_[i + 1], c.g);
  px_[i + 2] = mix(px_[i + 2], c.b);
}

void Canvas::fill_rect(int x, int y, int w, int h, Rgb c) {
  const int x0 = std::max(x, 0), y0 = std::max(y, 0);
  const int x1 = std::min(x + w, w_), y1 = std::min(y + h, h_);
  for (int yy = y0; yy < y1; ++yy) {
    for (int xx = x0; xx < x1; ++xx) set(xx, yy, c);
  }
}

void Canvas::rect_outline(int x, int y, int w, int h, Rgb c) {
  fill_rect(x, y, w, 1, c);
  fill_rect(x, y + h - 1, w, 1, c);
  fill_rect(x, y, 1, h, c);
  fill_rect(x + w - 1, y, 1, h, c);
}

void Canvas::line(double x0, double y0, double x1, double y1, Rgb c, double width, double dash) {
  const double dx = x1 - x0, dy = y1 - y0;
  const double len2 = dx * dx + dy * dy;
  const double half = width / 2.0;
  const int bx0 = static_cast<int>(std::floor(std::min(x0, x1) - half - 1));
  const int bx1 = static_cast<int>(std::ceil(std::max(x0, x1) + half + 1));
  const int by0 = static_cast<int>(std::floor(std::min(y0, y1) - half - 1));
  const int by1 = static_cast<int>(std::ceil(std::max(y0, y1) + half + 1));
  const double len = std::sqrt(len2);
  for (int y = std::max(by0, 0); y <= std::min(by1, h_ - 1); ++y) {
    for (int x = std::max(bx0, 0); x <= std::min(bx1, w_ - 1); ++x) {
      const double px = x + 0.5, py = y + 0.5;
      double t = len2 > 0 ? ((px - x0) * dx + (py - y0) * dy) / len2 : 0.0;
      t = std::clamp(t, 0.0, 1.0);
      if (dash > 0 && std::fmod(t * len, 2 * dash) > dash) continue;
      const double ex = x0 + t * dx - px, ey = y0 + t * dy - py;
      const double dist = std::sqrt(ex * ex + ey * ey);
      // Coverage falls from 1 to 0 over the pixel that straddles the edge.
      const double cover = std::clamp(half + 0.5 - dist, 0.0, 1.0);
      if (cover > 0) blend(x, y, c, static_cast<float>(cover));
    }
  }
}

void Canvas::disc(double cx, double cy, double radius, Rgb c) {
  for (int y = static_cast<int>(cy - radius - 1); y <= static_cast<int>(cy + radius + 1); ++y) {
    for (int x = static_cast<int>(cx - radius - 1); x <= static_cast<int>(cx + radius + 1); ++x) {
      const double d = std::hypot(x + 0.5 - cx, y + 0.5 - cy);
      const double cover = std::clamp(radius + 0.5 - d, 0.0, 1.0);
      if (cover > 0) blend(x, y, c, static_cast<float>(cover));
    }
  }
}

void Canvas::blit(const Canvas& src, int x, int y) {
  for (int yy = 0; yy < src.h_; ++yy) {
    for (int xx = 0; xx < src.w_; ++xx) set(x + xx, y + yy, src.at(xx, yy));
  }
}

}  // namespace diffattn::viz
