// Atomic file writes and whole-file reads (include/diffattn/base/files.h).
#include "diffattn/base/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "diffattn/base/memory.h"

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

namespace {

const char* file_kind(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a file";
}

std::string bytes_str(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%llu bytes (%.1f GiB)", static_cast<unsigned long long>(b),
                  static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(b));
  }
  return buf;
}

}  // namespace

InputFile::InputFile(const std::string& path) : path_(path) {
  if (path.empty()) throw IoError("cannot read a file with an empty name");
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) io_fail(path, "cannot open", errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    io_fail(path, "cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw IoError(path + ": not a regular file (" + file_kind(st.st_mode) + ")");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* dst, size_t n) const {
  char* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r < 0) io_fail(path_, "read failed at byte " + std::to_string(offset + done), errno);
    if (r == 0) {
      throw IoError(path_ + ": truncated: read " + std::to_string(done) + " of " +
                    std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                    " (the file is shorter than it was or than its header says)");
    }
    done += static_cast<size_t>(r);
  }
}

std::string InputFile::read_at(uint64_t offset, size_t n) const {
  std::string s(n, '\0');
  read_at(offset, s.data(), n);
  return s;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  InputFile f(path);  // a regular file, or an error naming it
  size_ = f.size();
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, f.fd(), 0);
  if (p == MAP_FAILED) io_fail(path, "cannot map", errno);
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

namespace {

// The pages wholly inside [begin, end) of a mapping (drop), or touching it (will_need).
void advise(const uint8_t* base, uint64_t size, uint64_t begin, uint64_t end, int advice,
            bool inner) {
  if (!base || begin >= end || end > size) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t b = inner ? (begin + page - 1) / page * page : begin / page * page;
  uint64_t e = inner ? end / page * page : std::min(size, (end + page - 1) / page * page);
  if (b >= e) return;
  ::madvise(const_cast<uint8_t*>(base) + b, static_cast<size_t>(e - b), advice);
}

}  // namespace

void MappedFile::will_need(uint64_t begin, uint64_t end) const {
  advise(data_, size_, begin, end, MADV_WILLNEED, false);
}

void MappedFile::drop(uint64_t begin, uint64_t end) const {
  advise(data_, size_, begin, end, MADV_DONTNEED, true);
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  InputFile f(path);
  if (f.size() > max_bytes) {
    throw IoError(path + ": " + bytes_str(f.size()) + ", more than the " + bytes_str(max_bytes) +
                  " this file may have");
  }
  check_fits_in_memory(static_cast<double>(f.size()), path + " (" + bytes_str(f.size()) + ")");
  return f.read_at(0, static_cast<size_t>(f.size()));
}

std::string read_file_prefix(const std::string& path, size_t n, uint64_t* file_size) {
  InputFile f(path);
  if (file_size) *file_size = f.size();
  return f.read_at(0, static_cast<size_t>(std::min<uint64_t>(n, f.size())));
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
