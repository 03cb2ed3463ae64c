// Files: atomic writes (temporary file in the target's directory, fsync, rename, fsync of the
// directory), PNG encoding with zlib (8-bit RGB, filter "none" per row) and NumPy .npy format 1.0.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "diffattn/viz.h"

namespace diffattn::viz {

namespace {

std::string errno_text() { return std::strerror(errno); }

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

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

void write_file_atomic(const std::string& path, const std::string& bytes) {
  if (path.empty()) throw IoError("cannot write a file with an empty name");
  std::random_device rd;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot create " + tmp + " (to write " + path + "): " + errno_text());
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IoError("cannot write " + path + ": " + why);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw IoError("cannot flush " + path + " to disk: " + why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw IoError("cannot rename " + tmp + " to " + path + ": " + why);
  }
  // The rename is durable only once the directory entry is on disk.
  const int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void make_dirs(const std::string& path) {
  if (path.empty()) throw IoError("cannot create a directory with an empty name");
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string part = path.substr(0, pos);
    if (part.empty()) continue;
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      throw IoError("cannot create directory " + part + ": " + errno_text());
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw IoError(path + " exists and is not a directory");
  }
}

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
