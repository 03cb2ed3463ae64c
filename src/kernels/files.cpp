// Atomic file writes and whole-file reads (include/diffattn/files.h).
#include "diffattn/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

namespace diffattn {

namespace {

// "path: what (strerror)" with the errno of the failed call.
[[noreturn]] void io_fail(const std::string& path, const std::string& what, int err) {
  throw IoError(path + ": " + what + (err ? std::string(" (") + std::strerror(err) + ")" : ""));
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  if (path.empty()) throw IoError("cannot write a file with an empty name");
  std::random_device rd;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) io_fail(path, "cannot create the temporary file " + tmp, errno);
  // On any failure the temporary file goes and the target is untouched.
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    io_fail(path, what, err);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    io_fail(path, "close failed", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    io_fail(path, "rename from the temporary file failed", err);
  }
  // The rename is durable only once the directory entry is on disk.
  const int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_file(const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) io_fail(path, "cannot open", errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) io_fail(path, "read failed", errno);
  return ss.str();
}

void make_dirs(const std::string& path) {
  if (path.empty()) throw IoError("cannot create a directory with an empty name");
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string part = path.substr(0, pos);
    if (part.empty()) continue;
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      io_fail(part, "cannot create the directory", errno);
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw IoError(path + ": exists and is not a directory");
  }
}

}  // namespace diffattn
