// Files, the one way the project writes them: atomically (a temporary file beside the target,
// fsync, rename, fsync of the directory), so a crash or a full disk never leaves a user's file
// half-written. Every error is an IoError naming the path and the system's reason.
// Reading: only regular files (a FIFO, a directory or a device is refused before any read, so
// nothing hangs or reads without end), exactly the size fstat reports, capped, and checked
// against the machine's memory; a short read is an error, never a silently shorter file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "diffattn/base/error.h"

namespace diffattn {

// Default cap of read_file: far above any text file the project reads (configs, logs, corpora).
inline constexpr uint64_t kMaxReadBytes = uint64_t{4} << 30;       // 4 GiB
// Cap for JSON files (config.json, run configs, specs): parsed JSON takes several times its size.
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{64} << 20;  // 64 MiB

// Writes bytes to path atomically; creates no directories.
void write_file_atomic(const std::string& path, const std::string& bytes);

// Replaces a set of files in a directory as one (a model: config.json, weights, tokenizer): at
// every instant, a kill -9 included, the directory holds the old set or the new one, never a
// mix, and its other entries (the user's) stay where they are.
//  - The new files are written into a staging directory beside DIR (".NAME.diffattn-XXXXXX" in
//    its parent, which must be writable), fsynced, then swapped in: DIR's other entries are
//    hard-linked into the staging directory and the two are exchanged with one
//    renameat2(RENAME_EXCHANGE) (on a filesystem without it: two renames, between which DIR is
//    briefly absent, never mixed). The old set's files go; an entry the links could not carry
//    (a file another user owns, where fs.protected_hardlinks forbids the link) is moved over
//    after the swap.
//  - When the new set differs from DIR's in one file only and removes none (a training
//    checkpoint: config.json unchanged, model.safetensors new), that file is renamed in alone.
//  - A swap cut short by a kill leaves the staging directory behind, with DIR's marker
//    ".diffattn-update" naming it when the swap itself had happened; the next update of DIR
//    finishes or removes it. Updates of directories with one parent take turns (flock on it).
// DIR (and its missing parents) is created when absent; a symlink to a directory is followed,
// so the directory it names is replaced. Errors are IoError naming DIR, and leave DIR as it was.
class DirectoryUpdate {
 public:
  explicit DirectoryUpdate(const std::string& dir);
  ~DirectoryUpdate();  // without commit(): the staging directory goes, DIR is untouched
  DirectoryUpdate(const DirectoryUpdate&) = delete;
  DirectoryUpdate& operator=(const DirectoryUpdate&) = delete;

  // Where file `name` of the new set is written (a plain file name).
  std::string path(const std::string& name) const;
  // Writes file `name` of the new set.
  void write(const std::string& name, const std::string& bytes);
  // Makes the written files DIR's. replaced(name): whether an entry of DIR belongs to the set
  // being replaced (a model's files): those not written again are removed with it; every other
  // entry of DIR is kept. Returns "" or a note on what could not be put back (an entry of the
  // old directory changed while the swap ran: left in the directory the note names).
  std::string commit(const std::function<bool(const std::string& name)>& replaced);

 private:
  std::string dir_;      // as given, for messages
  std::string target_;   // DIR, symlinks resolved, absolute
  std::string parent_;   // target_'s parent
  std::string staging_;  // beside it
  int staging_fd_ = -1;  // locked while this update lives
  bool done_ = false;
};

// A regular file open for reading (O_RDONLY | O_NONBLOCK | O_CLOEXEC, so opening a FIFO does not
// block; then fstat, and anything but a regular file is "PATH: not a regular file (a FIFO)").
class InputFile {
 public:
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  // st_size at open
  // Exactly n bytes from offset into dst; fewer is "PATH: truncated: read X of Y bytes ...".
  void read_at(uint64_t offset, void* dst, size_t n) const;
  std::string read_at(uint64_t offset, size_t n) const;
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A regular file mapped read only (PROT_READ, MAP_PRIVATE): a checkpoint's weights used where
// they lie, with no copy. The pages are the page cache's until touched. A file that another
// process truncates while it is mapped makes reads past its new end fault: map files that are
// not being rewritten (checkpoints are written atomically, by rename, which keeps the old file).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Hints for the byte range [begin, end): read it ahead; drop its pages from this process
  // (a later read maps them again from the file).
  void will_need(uint64_t begin, uint64_t end) const;
  void drop(uint64_t begin, uint64_t end) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// The whole file, at most max_bytes (an error naming the size and the cap otherwise) and no more
// than the machine's memory.
std::string read_file(const std::string& path, uint64_t max_bytes = kMaxReadBytes);
// The first min(n, file size) bytes; *file_size (if given) gets the whole file's size.
std::string read_file_prefix(const std::string& path, size_t n, uint64_t* file_size = nullptr);
// Creates a directory and its missing parents; an error when it cannot, or when path exists
// and is not a directory.
void make_dirs(const std::string& path);

}  // namespace diffattn
