// Text through FreeType: glyphs rendered as 8-bit coverage and blended onto the canvas. The font
// is found at run time (DejaVu Sans from Debian's fonts-dejavu-core, or $DIFFATTN_FONT) and
// loaded once; glyphs are cached per (code point, pixel size).
#include <ft2build.h>
#include FT_FREETYPE_H

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sys/stat.h>
#include <utility>

#include "diffattn/viz/viz.h"

namespace diffattn::viz {

namespace {

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// One UTF-8 sequence at s[i]: its code point and length; an invalid byte is reported as
// (U+FFFD, 1, false) so drawing never fails on odd input and labels can show it as \xNN.
struct Decoded {
  char32_t cp;
  size_t len;
  bool valid;
};

Decoded decode_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (len == 0 || i + len > s.size()) return {0xfffd, 1, false};
  char32_t cp = len == 1 ? c : c & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xc0) != 0x80) return {0xfffd, 1, false};
    cp = (cp << 6) | (cc & 0x3f);
  }
  return {cp, len, true};
}

std::vector<char32_t> decode_utf8(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    const Decoded d = decode_at(s, i);
    out.push_back(d.cp);
    i += d.len;
  }
  return out;
}

struct Glyph {
  int width = 0, rows = 0, left = 0, top = 0, advance = 0;
  std::vector<uint8_t> alpha;  // (rows, width) coverage
};

class FontCache {
 public:
  static FontCache& get() {
    static FontCache cache;
    return cache;
  }

  const Glyph& glyph(char32_t cp, int px) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_pair(cp, px);
    auto it = glyphs_.find(key);
    if (it != glyphs_.end()) return it->second;
    FT_Set_Pixel_Sizes(face_, 0, static_cast<FT_UInt>(px));
    Glyph g;
    if (FT_Load_Char(face_, cp, FT_LOAD_RENDER) != 0 &&
        FT_Load_Char(face_, U'?', FT_LOAD_RENDER) != 0) {
      return glyphs_[key] = g;
    }
    const FT_GlyphSlot s = face_->glyph;
    g.width = static_cast<int>(s->bitmap.width);
    g.rows = static_cast<int>(s->bitmap.rows);
    g.left = s->bitmap_left;
    g.top = s->bitmap_top;
    g.advance = static_cast<int>(s->advance.x >> 6);
    g.alpha.resize(static_cast<size_t>(g.width) * g.rows);
    for (int y = 0; y < g.rows; ++y) {
      for (int x = 0; x < g.width; ++x) {
        g.alpha[static_cast<size_t>(y) * g.width + x] = s->bitmap.buffer[y * s->bitmap.pitch + x];
      }
    }
    return glyphs_[key] = std::move(g);
  }

  // Ascent and descent (positive) in pixels at a size.
  std::pair<int, int> metrics(int px) {
    std::lock_guard<std::mutex> lock(mu_);
    FT_Set_Pixel_Sizes(face_, 0, static_cast<FT_UInt>(px));
    return {static_cast<int>(face_->size->metrics.ascender >> 6),
            static_cast<int>(-(face_->size->metrics.descender >> 6))};
  }

 private:
  FontCache() {
    const std::string path = font_path();
    if (FT_Init_FreeType(&lib_) != 0) throw IoError("FreeType could not be initialised");
    if (FT_New_Face(lib_, path.c_str(), 0, &face_) != 0) {
      throw IoError("font " + path + " could not be loaded by FreeType (is it a TrueType file?)");
    }
  }
  ~FontCache() {
    FT_Done_Face(face_);
    FT_Done_FreeType(lib_);
  }

  std::mutex mu_;
  FT_Library lib_ = nullptr;
  FT_Face face_ = nullptr;
  std::map<std::pair<char32_t, int>, Glyph> glyphs_;
};

// A line of text as a coverage mask (height = ascent + descent), drawn once, placed anywhere.
struct Mask {
  int w = 0, h = 0, ascent = 0;
  std::vector<uint8_t> a;
};

Mask render_mask(const std::string& text, int px) {
  FontCache& fc = FontCache::get();
  const auto [asc, desc] = fc.metrics(px);
  const std::vector<char32_t> cps = decode_utf8(text);
  int width = 0;
  for (char32_t cp : cps) width += fc.glyph(cp, px).advance;
  Mask m;
  m.w = std::max(width, 1);
  m.h = asc + desc;
  m.ascent = asc;
  m.a.assign(static_cast<size_t>(m.w) * m.h, 0);
  int pen = 0;
  for (char32_t cp : cps) {
    const Glyph& g = fc.glyph(cp, px);
    for (int y = 0; y < g.rows; ++y) {
      const int my = asc - g.top + y;
      if (my < 0 || my >= m.h) continue;
      for (int x = 0; x < g.width; ++x) {
        const int mx = pen + g.left + x;
        if (mx < 0 || mx >= m.w) continue;
        uint8_t& dst = m.a[static_cast<size_t>(my) * m.w + mx];
        dst = std::max(dst, g.alpha[static_cast<size_t>(y) * g.width + x]);
      }
    }
    pen += g.advance;
  }
  return m;
}

}  // namespace

std::string font_path() {
  if (const char* env = std::getenv("DIFFATTN_FONT"); env != nullptr && *env != '\0') {
    if (!is_file(env)) {
      throw IoError(std::string("DIFFATTN_FONT is \"") + env + "\", which is not a readable file");
    }
    return env;
  }
  const char* candidates[] = {
      "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
      "/usr/share/fonts/dejavu/DejaVuSans.ttf",
      "/usr/share/fonts/TTF/DejaVuSans.ttf",
  };
  std::string tried;
  for (const char* c : candidates) {
    if (is_file(c)) return c;
    tried += std::string(tried.empty() ? "" : ", ") + c;
  }
  throw IoError("no font for labels: tried " + tried +
                ". Install Debian's fonts-dejavu-core (scripts/setup.sh does) or set "
                "DIFFATTN_FONT to a TrueType file");
}

TextSize measure_text(const std::string& utf8, int px) {
  FontCache& fc = FontCache::get();
  const auto [asc, desc] = fc.metrics(px);
  TextSize s;
  for (char32_t cp : decode_utf8(utf8)) s.width += fc.glyph(cp, px).advance;
  s.height = asc + desc;
  s.ascent = asc;
  return s;
}

void draw_text(Canvas& c, int x, int y, const std::string& utf8, int px, Rgb color, HAlign h,
               VAlign v, bool rotated) {
  if (utf8.empty()) return;
  const Mask m = render_mask(utf8, px);
  // Size of the box as it appears on the canvas.
  const int bw = rotated ? m.h : m.w, bh = rotated ? m.w : m.h;
  int left = x, top = y;
  if (h == HAlign::Center) left -= bw / 2;
  if (h == HAlign::Right) left -= bw;
  if (!rotated) {
    if (v == VAlign::Middle) top -= bh / 2;
    if (v == VAlign::Baseline) top -= m.ascent;
    if (v == VAlign::Bottom) top -= bh;
  } else {
    // Turned text: "baseline" is the right edge of its box; vertical alignment is on its length.
    if (h == HAlign::Left && v == VAlign::Baseline) left -= m.ascent;
    if (v == VAlign::Middle) top -= bh / 2;
    if (v == VAlign::Bottom) top -= bh;
  }
  for (int my = 0; my < m.h; ++my) {
    for (int mx = 0; mx < m.w; ++mx) {
      const uint8_t a = m.a[static_cast<size_t>(my) * m.w + mx];
      if (a == 0) continue;
      // Counter-clockwise turn: the mask's column mx goes up from the bottom of the box.
      const int cx = rotated ? left + my : left + mx;
      const int cy = rotated ? top + (m.w - 1 - mx) : top + my;
      c.blend(cx, cy, color, a / 255.0f);
    }
  }
}

std::string display_label(const std::string& token, size_t max_chars) {
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < token.size();) {
    const Decoded d = decode_at(token, i);
    std::string piece;
    if (d.cp == U'\n') {
      piece = "\\n";
    } else if (d.cp == U'\t') {
      piece = "\\t";
    } else if (d.cp == U'\r') {
      piece = "\\r";
    } else if (!d.valid || d.cp < 0x20 || d.cp == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(token[i]));
      piece = buf;
    } else if (d.cp == U' ' && (i == 0 || i + 1 == token.size())) {
      piece = "\xc2\xb7";  // middle dot: a space at either end would be invisible
    } else {
      piece = token.substr(i, d.len);
    }
    if (chars + 1 > max_chars) return out + "...";
    out += piece;
    ++chars;
    i += d.len;
  }
  return out;
}

}  // namespace diffattn::viz
