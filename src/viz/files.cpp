// Image and array files: PNG encoding with zlib (8-bit RGB, filter "none" per row) and NumPy
// .npy format 1.0, both written atomically (include/diffattn/base/files.h).
#include <zlib.h>

#include <cstring>

#include "diffattn/viz/viz.h"

namespace diffattn::viz {

namespace {

void put_be32(std::string& s, uint32_t v) {
  s.push_back(static_cast<char>(v >> 24));
  s.push_back(static_cast<char>(v >> 16));
  s.push_back(static_cast<char>(v >> 8));
  s.push_back(static_cast<char>(v));
}

// A PNG chunk: length, type, data, CRC-32 of type and data.
void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_be32(out, static_cast<uint32_t>(data.size()));
  const std::string td = std::string(type, 4) + data;
  out += td;
  put_be32(out, static_cast<uint32_t>(
                    crc32(0L, reinterpret_cast<const Bytef*>(td.data()), static_cast<uInt>(td.size()))));
}

}  // namespace

std::string encode_png(const Canvas& c) {
  const int w = c.width(), h = c.height();
  // Scanlines, each preceded by its filter type (0: none).
  std::string raw;
  raw.reserve(static_cast<size_t>(h) * (1 + 3 * static_cast<size_t>(w)));
  const std::vector<uint8_t>& px = c.pixels();
  for (int y = 0; y < h; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(&px[static_cast<size_t>(y) * w * 3]),
               static_cast<size_t>(w) * 3);
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &zlen,
                reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
                6) != Z_OK) {
    throw IoError("zlib could not compress a " + std::to_string(w) + "x" + std::to_string(h) +
                  " image");
  }
  z.resize(zlen);
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(w));
  put_be32(ihdr, static_cast<uint32_t>(h));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, no filter set, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", "");
  return out;
}

void write_png(const std::string& path, const Canvas& c) { write_file_atomic(path, encode_png(c)); }

std::string encode_npy(const float* data, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  std::string dims;
  for (int64_t d : shape) {
    if (d < 0) throw InvalidArgument("npy: negative dimension " + std::to_string(d) + " in a shape");
    n *= d;
    dims += std::to_string(d) + ", ";
  }
  // (3, 4), but (5,) for one dimension and () for none.
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  if (shape.size() == 1) dims.resize(dims.size() - 1);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces and ending in a
  // newline so that the data starts on a 64-byte boundary.
  const size_t unpadded = 10 + header.size() + 1;
  header += std::string((64 - unpadded % 64) % 64, ' ') + "\n";
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  static_assert(sizeof(float) == 4);
  const uint16_t probe = 1;
  if (*reinterpret_cast<const uint8_t*>(&probe) != 1) {
    throw InvalidArgument("npy: writing from a big-endian machine is not supported");
  }
  out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n) * 4);
  return out;
}

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_file_atomic(path, encode_npy(data, shape));
}

}  // namespace diffattn::viz
