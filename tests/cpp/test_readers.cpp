// Readers of outside input (issue 9): read_file and InputFile (regular files only, exact length,
// capped), safetensors (in memory and from a path, header first, checked size products), model
// directories (header checked against the config before the model is allocated, no NaN weights)
// and resume points (every metadata field validated; a kill during the first checkpoint leaves
// a directory that is resumable or plainly not started).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>

#include "diffattn/data.h"
#include "diffattn/files.h"
#include "diffattn/model.h"
#include "diffattn/runtime.h"

namespace diffattn {
namespace {

namespace fs = std::filesystem;

// A fresh empty directory under the system's temporary directory, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "diffattn_readers.XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

void put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Expects f() to throw E whose message contains every one of parts.
template <class E, class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing \"" << *parts.begin() << "\"";
  } catch (const E& e) {
    const std::string m = e.what();
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "message: " << m << "\nmissing: " << p;
  }
}

ModelConfig tiny() {
  ModelConfig c;
  c.attention = nn::AttnKind::DiffV1;
  c.vocab_size = 23;
  c.d_model = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.ffn_dim = 24;
  c.max_seq_len = 16;
  return c;
}

// A safetensors file from a header JSON text and data bytes.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// ---- read_file ----

TEST(ReadFile, ReadsExactlyTheFile) {
  TempDir d;
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  put(d / "f", bytes);
  EXPECT_EQ(read_file(d / "f"), bytes);
  put(d / "empty", "");
  EXPECT_EQ(read_file(d / "empty"), "");
  uint64_t size = 0;
  EXPECT_EQ(read_file_prefix(d / "f", 10, &size), bytes.substr(0, 10));
  EXPECT_EQ(size, bytes.size());
  EXPECT_EQ(read_file_prefix(d / "empty", 10), "");
}

TEST(ReadFile, RefusesFifoDirectoryAndDevice) {
  TempDir d;
  // Without O_NONBLOCK the open of a FIFO with no writer never returns (the test would hang).
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  expect_error<IoError>([&] { read_file(d / "fifo"); }, {d / "fifo", "not a regular file (a FIFO)"});
  expect_error<IoError>([&] { read_file(d.str()); }, {"not a regular file (a directory)"});
  fs::create_symlink("/dev/zero", d / "zero");
  expect_error<IoError>([&] { read_file(d / "zero"); }, {d / "zero", "not a regular file (a character device)"});
  expect_error<IoError>([&] { read_file(d / "absent"); }, {d / "absent", "cannot open", "No such file"});
  expect_error<IoError>([&] { read_safetensors(d / "fifo"); }, {"a FIFO"});
}

TEST(ReadFile, CapsTheSizeAndChecksMemory) {
  TempDir d;
  put(d / "f", std::string(11, 'x'));
  EXPECT_EQ(read_file(d / "f", 11).size(), 11u);
  expect_error<IoError>([&] { read_file(d / "f", 10); }, {d / "f", "11 bytes", "more than the 10 bytes"});
  // A sparse file larger than the machine: an error before any allocation.
  const int64_t mem = memory_bytes();
  if (mem <= 0) GTEST_SKIP() << "the system does not report its memory";
  const int fd = ::open((d / "sparse").c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  const bool made = ::ftruncate(fd, static_cast<off_t>(mem) + (off_t{1} << 30)) == 0;
  ::close(fd);
  if (!made) GTEST_SKIP() << "cannot make a sparse file here";
  expect_error<IoError>([&] { read_file(d / "sparse"); }, {d / "sparse", "more than the"});
  expect_error<InvalidArgument>([&] { read_file(d / "sparse", std::numeric_limits<uint64_t>::max()); },
                                {d / "sparse", "more than this machine's"});
}

TEST(ReadFile, AShortReadIsAnError) {
  TempDir d;
  put(d / "f", std::string(10, 'x'));
  const InputFile f(d / "f");
  ASSERT_EQ(f.size(), 10u);
  ASSERT_EQ(::truncate((d / "f").c_str(), 3), 0);  // shrinks under the open file
  expect_error<IoError>([&] { f.read_at(0, 10); }, {d / "f", "truncated: read 3 of 10 bytes"});
}

}  // namespace
}  // namespace diffattn
