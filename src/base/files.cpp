// Atomic file writes and whole-file reads (include/diffattn/base/files.h).
#include "diffattn/base/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <vector>

#include "diffattn/base/json_util.h"
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

// ---- DirectoryUpdate ----

namespace {

// DIR's marker while a swap is being settled (and, inside a staging directory, what marks it
// as one): JSON {"old": NAME, "drop": [NAME, ...]}, the old directory beside DIR and the entries
// of it that belong to the replaced set.
constexpr const char* kUpdateMarker = ".diffattn-update";
// Files at most this large are compared byte for byte to find what a save leaves unchanged.
constexpr uint64_t kCompareMaxBytes = uint64_t{64} << 20;

std::string base_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

bool lstat_ok(const std::string& p, struct stat& st) { return ::lstat(p.c_str(), &st) == 0; }

bool exists(const std::string& p) {
  struct stat st {};
  return lstat_ok(p, st);
}

// The names in a directory (not "." or ".."), or an IoError.
std::vector<std::string> list_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) io_fail(dir, "cannot list the directory", errno);
  std::vector<std::string> out;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);  // symlinks are removed, never followed
}

// The process's umask, from /proc (022 when it cannot be read): umask() itself would change it.
mode_t current_umask() {
  try {
    const std::string status = read_file("/proc/self/status", 1 << 20);
    const size_t at = status.find("\nUmask:");
    if (at != std::string::npos) return static_cast<mode_t>(std::strtoul(status.c_str() + at + 7, nullptr, 8));
  } catch (const Error&) {
  }
  return 022;
}

// Whether two regular files hold the same bytes (files over kCompareMaxBytes are taken to differ).
bool same_bytes(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (!lstat_ok(a, sa) || !lstat_ok(b, sb) || !S_ISREG(sa.st_mode) || !S_ISREG(sb.st_mode) ||
      sa.st_size != sb.st_size || static_cast<uint64_t>(sa.st_size) > kCompareMaxBytes) {
    return false;
  }
  try {
    return read_file(a) == read_file(b);
  } catch (const Error&) {
    return false;
  }
}

std::string read_link(const std::string& p) {
  std::vector<char> buf(PATH_MAX + 1);
  const ssize_t n = ::readlink(p.c_str(), buf.data(), buf.size());
  return n < 0 ? std::string() : std::string(buf.data(), static_cast<size_t>(n));
}

// Puts `from` at `to` without copying data: a file (or FIFO, socket) by a hard link, a symlink
// recreated, a directory recreated with its entries carried the same way. false (and nothing
// left at `to`) when any part cannot be (a link the filesystem or fs.protected_hardlinks
// refuses): the entry is then moved after the swap instead.
bool carry(const std::string& from, const std::string& to) {
  struct stat st {};
  if (!lstat_ok(from, st)) return false;
  if (S_ISLNK(st.st_mode)) {
    const std::string target = read_link(from);
    return !target.empty() && ::symlink(target.c_str(), to.c_str()) == 0;
  }
  if (!S_ISDIR(st.st_mode)) return ::link(from.c_str(), to.c_str()) == 0;  // files, FIFOs, sockets
  if (::mkdir(to.c_str(), (st.st_mode & 07777) | 0700) != 0) return false;
  try {
    for (const std::string& n : list_dir(from)) {
      if (!carry(join(from, n), join(to, n))) {
        remove_tree(to);
        return false;
      }
    }
  } catch (const Error&) {
    remove_tree(to);
    return false;
  }
  ::chmod(to.c_str(), st.st_mode & 07777);
  fsync_dir(to);
  return true;
}

// After a swap: `old` holds what DIR held. Each entry of it goes: removed when it belongs to the
// replaced set (`drop`, top level only) or when DIR holds the same (the hard link or symlink the
// swap carried), moved into DIR when DIR lacks it (what could not be carried, or appeared in the
// old directory during the swap), left when DIR holds something else under its name. old is
// removed once empty. Returns "" or a note naming what was left.
std::string settle(const std::string& old, const std::string& dir, const std::set<std::string>& drop,
                   bool top) {
  std::vector<std::string> left;
  std::vector<std::string> names;
  try {
    names = list_dir(old);
  } catch (const Error&) {
    return "";
  }
  for (const std::string& n : names) {
    const std::string op = join(old, n), np = join(dir, n);
    struct stat so {}, sn {};
    if (!lstat_ok(op, so)) continue;
    if (top && n == kUpdateMarker) {
      ::unlink(op.c_str());
      continue;
    }
    if (top && drop.count(n) && !S_ISDIR(so.st_mode)) {
      ::unlink(op.c_str());
      continue;
    }
    if (!lstat_ok(np, sn)) {
      if (::rename(op.c_str(), np.c_str()) != 0) left.push_back(n);
      continue;
    }
    if (S_ISDIR(so.st_mode) && S_ISDIR(sn.st_mode)) {
      const std::string note = settle(op, np, {}, false);
      if (!note.empty()) left.push_back(n);
      continue;
    }
    const bool same = (so.st_dev == sn.st_dev && so.st_ino == sn.st_ino) ||
                      (S_ISLNK(so.st_mode) && S_ISLNK(sn.st_mode) && read_link(op) == read_link(np));
    if (same && !S_ISDIR(so.st_mode)) {
      ::unlink(op.c_str());
    } else {
      left.push_back(n);
    }
  }
  if (::rmdir(old.c_str()) == 0) return "";
  std::string list;
  for (const std::string& n : left) list += (list.empty() ? "" : ", ") + quote_name(n, 60);
  std::string kept = old;
  if (top) {
    // Renamed out of the update's names, so that no later update removes it.
    const std::string b = base_of(old);
    const size_t at = b.rfind(".diffattn-");
    if (at != std::string::npos) {
      const std::string to = join(dir_of(old), b.substr(0, at) + ".diffattn-kept-" + b.substr(b.size() - 6));
      if (::rename(old.c_str(), to.c_str()) == 0) kept = to;
    }
  }
  return kept + " keeps what changed in the old directory while it was replaced" +
         (list.empty() ? std::string() : ": " + list);
}

// The staging and old directories of updates of `base`: ".BASE.diffattn-new-XXXXXX" (written
// into, then, after an exchange, the old contents) and ".BASE.diffattn-old-XXXXXX" (DIR renamed
// aside where the filesystem cannot exchange).
std::string leftover_prefix(const std::string& base) { return "." + base + ".diffattn-"; }

// Whether another process holds the lock of the directory at path (a live update).
bool locked_by_another(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return true;  // cannot tell: leave it alone
  const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);
  return locked;
}

// Finishes or undoes what killed updates of target left (called with the parent locked):
//  1. DIR's marker: a swap happened and was not settled: settle it.
//  2. DIR missing, an old directory beside it: the two-rename fallback was cut between its
//     renames: the old directory goes back.
//  3. staging directories of updates that died before their swap: removed. (After step 1 a
//     "new-" directory no live update locks is one: the old directory of a swap lives under
//     that name only while DIR's marker names it, and what settling leaves is renamed "kept-".)
void recover(const std::string& parent, const std::string& target, const std::string& own) {
  const std::string base = base_of(target), prefix = leftover_prefix(base);
  const std::string marker = join(target, kUpdateMarker);
  if (exists(marker)) {
    try {
      const nlohmann::json j = parse_json_object(read_file(marker, kMaxJsonFileBytes), marker);
      const std::string old = j.at("old").get<std::string>();
      std::set<std::string> drop;
      for (const auto& d : j.at("drop")) drop.insert(d.get<std::string>());
      if (old.rfind(prefix, 0) == 0 && old.find('/') == std::string::npos && exists(join(parent, old)) &&
          !locked_by_another(join(parent, old))) {
        settle(join(parent, old), target, drop, true);
      }
    } catch (const std::exception&) {
      // unreadable: the marker goes, what it named stays beside DIR
    }
    ::unlink(marker.c_str());
    fsync_dir(target);
  }
  std::vector<std::string> names;
  try {
    names = list_dir(parent);
  } catch (const Error&) {
    return;
  }
  for (const std::string& n : names) {
    if (n.rfind(prefix, 0) != 0 || join(parent, n) == own) continue;
    const std::string p = join(parent, n);
    struct stat st {};
    if (!lstat_ok(p, st) || !S_ISDIR(st.st_mode) || locked_by_another(p)) continue;
    const std::string kind = n.substr(prefix.size(), 4);
    if (kind == "old-" && !exists(target)) {
      if (::rename(p.c_str(), target.c_str()) == 0) fsync_dir(parent);
    } else if (kind == "new-") {
      remove_tree(p);
    }
  }
}

}  // namespace

DirectoryUpdate::DirectoryUpdate(const std::string& dir) : dir_(dir) {
  if (dir.empty()) throw IoError("cannot write a directory with an empty name");
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  struct stat st {};
  char real[PATH_MAX];
  if (::stat(d.c_str(), &st) == 0) {  // follows a symlink: the directory it names is replaced
    if (!S_ISDIR(st.st_mode)) throw IoError(dir + ": exists and is not a directory");
    if (::realpath(d.c_str(), real) == nullptr) io_fail(dir, "cannot resolve the path", errno);
    target_ = real;
  } else {
    const std::string p = dir_of(d), b = base_of(d);
    if (b.empty() || b == "." || b == "..") throw IoError(dir + ": not a directory name to create");
    if (p != "." && p != "/") make_dirs(p);
    if (::realpath(p.c_str(), real) == nullptr) io_fail(p, "cannot resolve the path", errno);
    target_ = join(real, b);
  }
  if (target_ == "/") throw IoError(dir + ": the root directory cannot be replaced");
  parent_ = dir_of(target_);
  // Made and locked under the parent's lock: another update's recovery never sees it unlocked.
  const int pfd = ::open(parent_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0) io_fail(parent_, "cannot open the directory", errno);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{pfd};
  while (::flock(pfd, LOCK_EX) != 0) {
    if (errno != EINTR) io_fail(parent_, "cannot lock the directory", errno);
  }
  std::string tmpl = join(parent_, leftover_prefix(base_of(target_)) + "new-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    io_fail(dir, "cannot create a staging directory in " + parent_ +
                     " (the new files are written beside the directory, then swapped in, so its "
                     "parent must be writable)", errno);
  }
  staging_ = tmpl;
  staging_fd_ = ::open(staging_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (staging_fd_ < 0 || ::flock(staging_fd_, LOCK_EX) != 0) {
    const int err = errno;
    if (staging_fd_ >= 0) ::close(staging_fd_);
    remove_tree(staging_);
    io_fail(staging_, "cannot lock the staging directory", err);
  }
}

DirectoryUpdate::~DirectoryUpdate() {
  // Before a swap the staging directory holds new files and links to files DIR still has.
  if (!done_) remove_tree(staging_);
  if (staging_fd_ >= 0) ::close(staging_fd_);
}

std::string DirectoryUpdate::path(const std::string& name) const {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
      name == kUpdateMarker) {
    throw IoError(dir_ + ": \"" + name + "\" is not a file name to write");
  }
  return join(staging_, name);
}

void DirectoryUpdate::write(const std::string& name, const std::string& bytes) {
  write_file_atomic(path(name), bytes);
}

std::string DirectoryUpdate::commit(const std::function<bool(const std::string&)>& replaced) {
  if (done_) throw IoError(dir_ + ": this update was committed already");
  // One commit at a time among the directories of this parent (and their recoveries).
  const int pfd = ::open(parent_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0) io_fail(parent_, "cannot open the directory", errno);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{pfd};
  while (::flock(pfd, LOCK_EX) != 0) {
    if (errno != EINTR) io_fail(parent_, "cannot lock the directory", errno);
  }
  recover(parent_, target_, staging_);

  std::vector<std::string> staged;
  for (const std::string& n : list_dir(staging_)) {
    if (n != kUpdateMarker) staged.push_back(n);
  }
  const std::set<std::string> staged_set(staged.begin(), staged.end());
  const std::string marker = join(staging_, kUpdateMarker);
  struct stat st {};
  if (!lstat_ok(target_, st)) {
    // A new directory: the staging one, renamed into place.
    ::chmod(staging_.c_str(), 0777 & ~current_umask());
    fsync_dir(staging_);
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_NOREPLACE) == 0 ||
        ((errno == EINVAL || errno == ENOSYS) && !exists(target_) &&
         ::rename(staging_.c_str(), target_.c_str()) == 0)) {
      done_ = true;
      fsync_dir(parent_);
      return "";
    }
    if (errno != EEXIST) io_fail(dir_, "cannot rename the staging directory " + staging_ + " into place", errno);
    // created meanwhile: replaced like any other
  }
  if (!lstat_ok(target_, st) || !S_ISDIR(st.st_mode)) throw IoError(dir_ + ": exists and is not a directory");

  // What DIR holds: the replaced set (written again or not) and the rest, which stays.
  std::set<std::string> drop;
  std::vector<std::string> keep;
  for (const std::string& n : list_dir(target_)) {
    if (staged_set.count(n) || n == kUpdateMarker || replaced(n)) {
      drop.insert(n);
    } else {
      keep.push_back(n);
    }
  }
  // One file new or changed and nothing removed: that file renamed in is the whole update.
  const bool removes = std::any_of(drop.begin(), drop.end(), [&](const std::string& n) { return !staged_set.count(n); });
  if (!removes) {
    std::vector<std::string> differ;
    for (const std::string& n : staged) {
      if (!same_bytes(join(staging_, n), join(target_, n))) differ.push_back(n);
    }
    if (differ.size() <= 1) {
      if (!differ.empty() &&
          ::rename(join(staging_, differ[0]).c_str(), join(target_, differ[0]).c_str()) != 0) {
        io_fail(join(target_, differ[0]), "cannot rename the new file into place", errno);
      }
      fsync_dir(target_);
      return "";  // the destructor removes the staging directory and its unchanged files
    }
  }

  // The whole directory: the rest of DIR carried into the staging one, then the two exchanged.
  for (const std::string& n : keep) carry(join(target_, n), join(staging_, n));
  ::chmod(staging_.c_str(), st.st_mode & 07777);
  std::string old = staging_;
  auto write_marker = [&](const std::string& old_path) {
    nlohmann::json j = {{"old", base_of(old_path)}, {"drop", nlohmann::json::array()}};
    for (const std::string& n : drop) j["drop"].push_back(n);
    write_file_atomic(marker, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  };
  write_marker(old);
  fsync_dir(staging_);
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != EOPNOTSUPP) {
      io_fail(dir_, "cannot swap the new files in (" + std::string(std::strerror(err)) + ")" +
                        (err == EBUSY || err == EXDEV ? ": a mount point cannot be replaced; write into a directory inside it" : ""),
              0);
    }
    // No exchange on this filesystem: DIR aside, the staging directory in its place. Between
    // the two renames DIR is absent (a reader finds no model, never a mixed one); a kill there
    // is undone by the next update (recover, step 2).
    old = join(parent_, leftover_prefix(base_of(target_)) + "old-" + base_of(staging_).substr(base_of(staging_).size() - 6));
    write_marker(old);
    if (::rename(target_.c_str(), old.c_str()) != 0) io_fail(dir_, "cannot move the old directory aside", errno);
    if (::rename(staging_.c_str(), target_.c_str()) != 0) {
      const int e2 = errno;
      ::rename(old.c_str(), target_.c_str());
      io_fail(dir_, "cannot rename the staging directory into place", e2);
    }
  }
  done_ = true;  // from here the staging path holds the old directory: never removed blindly
  fsync_dir(parent_);
  const std::string note = settle(old, target_, drop, true);
  ::unlink(join(target_, kUpdateMarker).c_str());
  fsync_dir(target_);
  return note;
}

}  // namespace diffattn
