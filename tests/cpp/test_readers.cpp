// Readers of outside input (issue 9): read_file and InputFile (regular files only, exact length,
// capped), safetensors (in memory and from a path, header first, checked size products), model
// directories (header checked against the config before the model is allocated, no NaN weights)
// and resume points (every metadata field validated; a kill during the first checkpoint leaves
// a directory that is resumable or plainly not started).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>

#include "diffattn/base/files.h"
#include "diffattn/base/memory.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/safetensors.h"
#include "diffattn/train/train.h"
#include "temp_dir.h"

namespace diffattn {
namespace {

namespace fs = std::filesystem;

using TempDir = testing::TempDir;

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

model::ModelConfig tiny() {
  model::ModelConfig c;
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
  expect_error<IoError>([&] { model::read_safetensors(d / "fifo"); }, {"a FIFO"});
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
                                {d / "sparse", "needs about", "of memory"});
}

TEST(ReadFile, MemoryCheckHonoursTheProcessLimit) {
  // In a child, so the limit stays there: under ulimit -v 1 GiB a 2 GiB read is refused in words
  // (before: std::bad_alloc, or a short read accepted as the file).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit r {};
    r.rlim_cur = r.rlim_max = rlim_t{1} << 30;
    if (::setrlimit(RLIMIT_AS, &r) != 0) ::_exit(3);
    try {
      check_fits_in_memory(2.0 * (1 << 30), "the test's buffer");
    } catch (const InvalidArgument& e) {
      ::_exit(std::strstr(e.what(), "the test's buffer needs about 2.0 GiB, more than this process's "
                                    "limit (ulimit -v) of 1.0 GiB of memory") ? 0 : 2);
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error, 2: another message, 3: setrlimit failed";
}

TEST(ReadFile, AShortReadIsAnError) {
  TempDir d;
  put(d / "f", std::string(10, 'x'));
  const InputFile f(d / "f");
  ASSERT_EQ(f.size(), 10u);
  ASSERT_EQ(::truncate((d / "f").c_str(), 3), 0);  // shrinks under the open file
  expect_error<IoError>([&] { f.read_at(0, 10); }, {d / "f", "truncated: read 3 of 10 bytes"});
}

// ---- safetensors ----

TEST(SafeTensorsReader, InMemoryAndPathAgree) {
  TempDir d;
  const std::vector<float> a = {1.0f, -2.5f, 3.0f, 0.25f, 5.0f, 6.0f}, b = {7.0f};
  model::write_safetensors(d / "t.safetensors", {{"a", {2, 3}, a.data()}, {"b", {1}, b.data()}}, {{"k", "v"}});
  const model::SafeTensorsFile p = model::read_safetensors(d / "t.safetensors");
  const model::SafeTensorsFile m = model::parse_safetensors(read_file(d / "t.safetensors"), "mem");
  for (const model::SafeTensorsFile* f : {&p, &m}) {
    EXPECT_EQ(f->tensors.at("a").shape, (Shape{2, 3}));
    EXPECT_EQ(f->tensors.at("a").data, a);
    EXPECT_EQ(f->tensors.at("b").data, b);
    EXPECT_EQ(f->metadata.at("k"), "v");
  }
  const model::SafeTensorsHeader h = model::read_safetensors_header(d / "t.safetensors");
  EXPECT_EQ(h.tensors.at("a").numel, 6);
  EXPECT_EQ(h.tensors.at("a").end - h.tensors.at("a").begin, 24u);
}

TEST(SafeTensorsReader, BF16AndF16AreConverted) {
  // bf16 0x3fc0 = 1.5; f16 0x3c00 = 1, 0xc000 = -2, 0x0001 = 2^-24 (subnormal), 0x7c00 = inf.
  const std::string data("\xc0\x3f" "\x00\x3c" "\x00\xc0" "\x01\x00" "\x00\x7c", 10);
  const std::string f = safetensors_bytes(
      R"({"b":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
      R"("h":{"dtype":"F16","shape":[4],"data_offsets":[2,10]}})", data);
  const model::SafeTensorsFile s = model::parse_safetensors(f, "mem");
  EXPECT_EQ(s.tensors.at("b").data, std::vector<float>{1.5f});
  const std::vector<float>& h = s.tensors.at("h").data;
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[3]));
}

TEST(SafeTensorsReader, SizeProductsThatOverflowAreErrors) {
  // 2^62 x 8 wraps to 0 in int64 and would match zero data bytes.
  expect_error<IoError>(
      [] { model::parse_safetensors(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,0]}})", ""), "t.st"); },
      {"t.st: tensor \"w\": shape", "more elements than 2^63"});
  // 2^62 elements fit, but 4 bytes each wrap uint64 to 0.
  expect_error<IoError>(
      [] { model::parse_safetensors(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", ""), "t.st"); },
      {"t.st: tensor \"w\"", "more than 2^64 bytes"});
  // A size beyond int64 is not a size.
  expect_error<IoError>(
      [] { model::parse_safetensors(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})", ""), "t.st"); },
      {"t.st: tensor \"w\": shape", "is not a list of sizes"});
  // A zero-size tensor is fine.
  const model::SafeTensorsFile z = model::parse_safetensors(
      safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}})", ""), "t.st");
  EXPECT_TRUE(z.tensors.at("w").data.empty());
}

TEST(SafeTensorsReader, HeaderLengthIsCapped) {
  std::string f(8, '\0');
  const uint64_t hl = model::kMaxSafetensorsHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) f[static_cast<size_t>(i)] = static_cast<char>((hl >> (8 * i)) & 0xff);
  expect_error<IoError>([&] { model::parse_safetensors(f, "big.st"); }, {"big.st: header length 100000001 exceeds the limit"});
  expect_error<IoError>([&] { model::parse_safetensors(std::string("\x05\0\0", 3), "short.st"); },
                        {"short.st: truncated: 3 bytes"});
  // Long names are cut in messages.
  const std::string name(5000, 'n');
  expect_error<IoError>(
      [&] { model::parse_safetensors(safetensors_bytes("{\"" + name + "\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x"), "t.st"); },
      {"...\": dtype I8 is not supported"});
}

// The reference library's rules (tests/python/test_safetensors_oracle.py compares the verdicts
// on many more files): the tensors tile the data exactly, and the header is JSON as serde reads it.
TEST(SafeTensorsReader, TheDataIsCoveredExactly) {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data(8, '\0');
  EXPECT_EQ(model::parse_safetensors(safetensors_bytes("{" + a + "}", data), "t.st").tensors.size(), 1u);
  expect_error<IoError>([&] { model::parse_safetensors(safetensors_bytes("{" + a + "}", data + "tail"), "t.st"); },
                        {"t.st: the tensors cover 8 of the 12 data bytes", "4 bytes after the last tensor"});
  expect_error<IoError>(
      [&] { model::parse_safetensors(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", "gap." + data), "t.st"); },
      {"t.st: tensor \"a\" begins at data byte 4, expected 0", "a gap of 4 bytes"});
  expect_error<IoError>(
      [&] { model::parse_safetensors(safetensors_bytes("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "t.st"); },
      {"tensor \"b\" begins at data byte 4, expected 8", "overlaps"});
  // An empty tensor is placed like any other: at the end (or the start), not inside another.
  EXPECT_NO_THROW(model::parse_safetensors(safetensors_bytes("{" + a + R"(,"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})", data), "t.st"));
  expect_error<IoError>(
      [&] { model::parse_safetensors(safetensors_bytes("{" + a + R"(,"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", data), "t.st"); },
      {"tensor \"z\" begins at data byte 4, expected 8"});
  // nlohmann stopped at a NUL and skipped a byte order mark; serde (the library) refuses both.
  expect_error<IoError>([&] { model::parse_safetensors(safetensors_bytes("{" + a + std::string("}\0junk", 6), data), "t.st"); },
                        {"t.st: corrupted safetensors header: not valid JSON (a NUL byte at offset"});
  expect_error<IoError>([&] { model::parse_safetensors(safetensors_bytes("\xEF\xBB\xBF{" + a + "}", data), "t.st"); },
                        {"byte order mark"});
  // A field of an entry twice, or __metadata__ twice, is an error; a tensor or metadata key
  // twice keeps the last (as the library does).
  expect_error<IoError>(
      [&] { model::parse_safetensors(safetensors_bytes(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", data), "t.st"); },
      {"the key \"dtype\" appears twice in \"a\""});
  expect_error<IoError>(
      [&] { model::parse_safetensors(safetensors_bytes(R"({"__metadata__":{},"__metadata__":{},)" + a + "}", data), "t.st"); },
      {"the key \"__metadata__\" appears twice in the top-level object"});
  const model::SafeTensorsFile last = model::parse_safetensors(
      safetensors_bytes(R"({"__metadata__":{"k":"1","k":"2"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)" + a + "}", data), "t.st");
  EXPECT_EQ(last.tensors.at("a").shape, (Shape{2}));
  EXPECT_EQ(last.metadata.at("k"), "2");
  // __metadata__ may be null; -0 is not a size; a dtype outside the format's list is named.
  EXPECT_NO_THROW(model::parse_safetensors(safetensors_bytes(R"({"__metadata__":null,)" + a + "}", data), "t.st"));
  expect_error<IoError>(
      [&] { model::parse_safetensors(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}})", ""), "t.st"); },
      {"is not a list of sizes"});
  expect_error<IoError>(
      [&] { model::parse_safetensors(safetensors_bytes(R"({"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", data), "t.st"); },
      {"dtype \"f32\" is not a safetensors dtype"});
}

TEST(SafeTensorsReader, HeaderIsReadWithoutTheData) {
  // A header announcing 8 GiB of data in a sparse file: the header alone is read (a whole-file
  // read would allocate 8 GiB).
  TempDir d;
  const std::string h = safetensors_bytes(
      R"({"w":{"dtype":"F32","shape":[1073741824,2],"data_offsets":[0,8589934592]}})", "");
  put(d / "big.safetensors", h);
  if (::truncate((d / "big.safetensors").c_str(), static_cast<off_t>(h.size()) + (off_t{8} << 30)) != 0) {
    GTEST_SKIP() << "cannot make a sparse file here";
  }
  const model::SafeTensorsHeader hd = model::read_safetensors_header(d / "big.safetensors");
  EXPECT_EQ(hd.tensors.at("w").shape, (Shape{1073741824, 2}));
  EXPECT_EQ(hd.data_offset, h.size());
  // The data read checks the size first: the file changed since its header was read.
  ASSERT_EQ(::truncate((d / "big.safetensors").c_str(), static_cast<off_t>(h.size()) + 8), 0);
  expect_error<IoError>([&] { model::read_safetensors(d / "big.safetensors", hd); }, {"changed while being read"});
}

// ---- model directories ----

long max_rss_kib() {
  rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(LoadModel, HeaderIsCheckedBeforeTheModelIsAllocated) {
  TempDir d;
  model::Model m(tiny());
  m.init_weights(1);
  model::save_model(m, d.str());
  // A config of 50M parameters (400 MB with gradients) whose weights are the tiny model's.
  model::ModelConfig big = tiny();
  big.ffn_dim = int64_t{1} << 20;
  put(d / "config.json", big.to_json());
  const long before = max_rss_kib();
  expect_error<IoError>([&] { model::load_model(d.str()); },
                        {d / "model.safetensors", "tensor \"layers.0.ffn.gate_proj.weight\" has shape (24, 16)",
                         "the config implies (1048576, 16)"});
  EXPECT_LT(max_rss_kib() - before, 100 * 1024) << "the model was allocated before the check";
}

TEST(LoadModel, NonFiniteWeightsAreErrors) {
  TempDir d;
  model::Model m(tiny());
  m.init_weights(1);
  const model::TensorInfo& t = m.tensors()[3];
  m.params()[static_cast<size_t>(t.offset + 5)] = std::numeric_limits<float>::quiet_NaN();
  model::save_model(m, d.str());
  expect_error<IoError>([&] { model::load_model(d.str()); },
                        {d / "model.safetensors", "tensor \"" + t.name + "\" holds NaN at flat index 5"});
  m.params()[static_cast<size_t>(t.offset + 5)] = -std::numeric_limits<float>::infinity();
  model::save_model(m, d.str());
  expect_error<IoError>([&] { model::load_model(d.str()); }, {"holds Inf at flat index 5"});
}

// ---- resume points ----

train::TrainOptions small_opts() {
  train::TrainOptions o;
  o.steps = 10;
  o.batch = 2;
  o.seq_len = 8;
  return o;
}

std::map<std::string, std::string> good_meta() {
  return {{"format", "diffattn-train/1"}, {"step", "4"}, {"adamw_t", "4"},
          {"config", tiny().to_json()},   {"train", small_opts().to_json()}};
}

TEST(ResumeMetadata, EveryFieldIsValidated) {
  const train::TrainState st = train::parse_train_state(good_meta(), "run/train_state.safetensors");
  EXPECT_EQ(st.step, 4);
  EXPECT_EQ(st.adamw_t, 4);
  EXPECT_EQ(st.options.steps, 10);
  for (const char* bad : {"abc", "-5", "", " 4", "4 ", "1e3", "+4", "11", "99999999999999999999999"}) {
    auto meta = good_meta();
    meta["step"] = bad;
    expect_error<IoError>([&] { train::parse_train_state(meta, "run/train_state.safetensors"); },
                          {"run/train_state.safetensors: metadata \"step\" is", "expected a whole number from 0 to 10"});
  }
  auto meta = good_meta();
  meta["adamw_t"] = "5";  // more updates than steps
  expect_error<IoError>([&] { train::parse_train_state(meta, "f"); }, {"f: metadata \"adamw_t\" is \"5\"", "from 0 to 4"});
  meta = good_meta();
  meta.erase("adamw_t");
  expect_error<IoError>([&] { train::parse_train_state(meta, "f"); }, {"f: metadata has no \"adamw_t\""});
  meta = good_meta();
  meta["train"] = R"({"steps": -3})";
  expect_error<IoError>([&] { train::parse_train_state(meta, "f"); }, {"f (metadata train)", "steps must be between 1"});
  meta["train"] = R"({"tokenizer": "bpe"})";
  expect_error<IoError>([&] { train::parse_train_state(meta, "f"); }, {"f (metadata train): \"tokenizer\" is \"bpe\""});
  meta["train"] = R"({"seed": -1})";
  expect_error<IoError>([&] { train::parse_train_state(meta, "f"); }, {"\"seed\" must be a whole number"});
  meta["train"] = R"({"batch": 18446744073709551615})";
  expect_error<IoError>([&] { train::parse_train_state(meta, "f"); }, {"\"batch\" must be an integer"});
  meta = good_meta();
  meta["config"] = "{\"format\": [[[[[[]]]]]]}";
  expect_error<IoError>([&] { train::parse_train_state(meta, "f"); }, {"f (metadata config)"});
}

TEST(ResumeMetadata, BadStepInAFileNamesTheFileAndField) {
  TempDir d;
  train::Trainer tr(d.str(), tiny(), small_opts());
  tr.write_log = false;
  tr.save();
  const std::string p = d / "train_state.safetensors";
  model::SafeTensorsFile f = model::read_safetensors(p);
  f.metadata["step"] = "abc";
  std::vector<model::SafeTensorRef> refs;
  for (const auto& [name, t] : f.tensors) refs.push_back({name, t.shape, t.data.data()});
  model::write_safetensors(p, refs, f.metadata);
  expect_error<IoError>([&] { train::Trainer::resume(d.str()); }, {p, "metadata \"step\" is \"abc\""});
  // A moment tensor missing: named, before the model is allocated.
  refs.erase(std::remove_if(refs.begin(), refs.end(), [](const model::SafeTensorRef& r) { return r.name == "adamw.v.norm.weight"; }), refs.end());
  f.metadata["step"] = "0";
  model::write_safetensors(p, refs, f.metadata);
  expect_error<IoError>([&] { train::Trainer::resume(d.str()); }, {p, "missing tensor \"adamw.v.norm.weight\""});
}

// Every state a kill during the first checkpoint can leave: the files save() writes, in its
// order, cut after each one (with the temporary file of the next one left behind).
TEST(Checkpoint, EveryPrefixOfTheFirstSaveIsResumableOrNotStarted) {
  TempDir full;
  {
    train::Trainer tr(full.str(), tiny(), small_opts());
    tr.write_log = false;
    tr.save();
  }
  const std::vector<std::string>& files = train::Trainer::checkpoint_files();
  ASSERT_EQ(files.size(), 3u);
  for (size_t k = 0; k <= files.size(); ++k) {
    SCOPED_TRACE("files kept: " + std::to_string(k));
    TempDir d;
    for (size_t i = 0; i < k; ++i) fs::copy_file(full / files[i], d / files[i]);
    if (k < files.size()) put(d / (files[k] + ".tmp.123.456"), "partial");
    const bool resumable = fs::exists(d / "train_state.safetensors");
    if (k == 0) {
      EXPECT_FALSE(resumable);
      // Nothing was saved: the run is simply not started (`train` without --resume runs it).
      expect_error<IoError>([&] { train::Trainer::resume(d.str()); }, {"no resume point", "without --resume"});
      continue;
    }
    EXPECT_TRUE(resumable);
    const train::Trainer t = train::Trainer::resume(d.str());
    EXPECT_EQ(t.steps_done(), 0);
    if (k < files.size()) {
      EXPECT_FALSE(fs::exists(d / (files[k] + ".tmp.123.456"))) << "resume removes the leftover";
    }
    if (fs::exists(d / "config.json")) {
      EXPECT_NO_THROW(model::load_model(d.str()));
    }
  }
}

// ---- replacing a model directory as one (tests/python/test_atomic_saves.py kills real saves
// at every step) ----

std::vector<std::string> entries(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string text_of(const fs::path& p) { return read_file(p.string()); }

TEST(DirectoryUpdate, ReplacesTheSetAndKeepsTheRest) {
  TempDir t;
  const fs::path d = fs::path(t.str()) / "m";
  fs::create_directories(d / "notes");
  put(d / "config.json", "old");
  put(d / "model-00001-of-00002.safetensors", "old shard");
  put(d / "README.md", "mine");
  put(d / "notes" / "a.txt", "mine too");
  fs::create_symlink("README.md", d / "readme");
  const auto ino = fs::hard_link_count(d / "README.md");
  {
    DirectoryUpdate u(d.string());
    u.write("config.json", "new");
    u.write("model.safetensors", "new weights");
    EXPECT_EQ(u.commit([](const std::string& n) { return n == "config.json" || n.rfind("model", 0) == 0; }), "");
  }
  EXPECT_EQ(entries(d), (std::vector<std::string>{"README.md", "config.json", "model.safetensors", "notes", "readme"}));
  EXPECT_EQ(text_of(d / "config.json"), "new");
  EXPECT_EQ(text_of(d / "notes" / "a.txt"), "mine too");
  EXPECT_EQ(fs::read_symlink(d / "readme"), "README.md");
  EXPECT_EQ(fs::hard_link_count(d / "README.md"), ino);  // the same file, not a copy left linked
  EXPECT_EQ(entries(t.str()), (std::vector<std::string>{"m"}));  // nothing left beside it
}

TEST(DirectoryUpdate, OneChangedFileIsRenamedInAlone) {
  TempDir t;
  const fs::path d = fs::path(t.str()) / "m";
  fs::create_directories(d);
  put(d / "config.json", "same");
  put(d / "model.safetensors", "old");
  struct stat before {};
  ASSERT_EQ(::stat(d.c_str(), &before), 0);
  {
    DirectoryUpdate u(d.string());
    u.write("config.json", "same");
    u.write("model.safetensors", "new");
    u.commit([](const std::string&) { return false; });
  }
  struct stat after {};
  ASSERT_EQ(::stat(d.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino) << "the directory itself was swapped";
  EXPECT_EQ(text_of(d / "model.safetensors"), "new");
  EXPECT_EQ(entries(t.str()), (std::vector<std::string>{"m"}));
}

TEST(DirectoryUpdate, NewDirectoriesUncommittedUpdatesAndErrors) {
  TempDir t;
  const fs::path d = fs::path(t.str()) / "a" / "b" / "m";
  {
    DirectoryUpdate u(d.string());
    u.write("config.json", "x");
    // not committed: nothing appears, nothing is left
  }
  EXPECT_FALSE(fs::exists(d));
  EXPECT_EQ(entries(fs::path(t.str()) / "a" / "b"), std::vector<std::string>{});
  {
    DirectoryUpdate u(d.string());
    u.write("config.json", "x");
    u.commit([](const std::string&) { return true; });
  }
  EXPECT_EQ(entries(d), std::vector<std::string>{"config.json"});
  put(fs::path(t.str()) / "file", "x");
  expect_error<IoError>([&] { DirectoryUpdate u((fs::path(t.str()) / "file").string()); }, {"exists and is not a directory"});
  DirectoryUpdate u(d.string());
  expect_error<IoError>([&] { u.write("../x", "y"); }, {"is not a file name to write"});
  expect_error<IoError>([&] { u.write(".diffattn-update", "y"); }, {"is not a file name to write"});
}

// What a kill leaves, finished or undone by the next update of the directory.
TEST(DirectoryUpdate, TheNextUpdateFinishesWhatAKillLeft) {
  TempDir t;
  const fs::path p(t.str()), d = p / "m";
  fs::create_directories(d);
  put(d / "config.json", "new");
  put(d / "mine", "mine");
  // 1. A swap that happened, not settled: the old directory beside DIR, DIR's marker naming it.
  fs::create_directories(p / ".m.diffattn-new-abc123");
  put(p / ".m.diffattn-new-abc123" / "config.json", "old");
  put(p / ".m.diffattn-new-abc123" / "model.safetensors", "old weights");
  put(p / ".m.diffattn-new-abc123" / "moved", "a file the swap could not carry");
  ASSERT_EQ(::link((d / "mine").c_str(), (p / ".m.diffattn-new-abc123" / "mine").c_str()), 0);
  put(d / ".diffattn-update", R"({"old": ".m.diffattn-new-abc123", "drop": ["config.json", "model.safetensors"]})");
  // 3. The staging directory of an update that died before its swap.
  fs::create_directories(p / ".m.diffattn-new-zzzzzz");
  put(p / ".m.diffattn-new-zzzzzz" / "config.json", "never swapped in");
  {
    DirectoryUpdate u(d.string());
    u.write("config.json", "newer");
    u.commit([](const std::string& n) { return n == "config.json" || n == "model.safetensors"; });
  }
  EXPECT_EQ(entries(d), (std::vector<std::string>{"config.json", "mine", "moved"}));
  EXPECT_EQ(text_of(d / "config.json"), "newer");
  EXPECT_EQ(entries(p), std::vector<std::string>{"m"});
  // 2. The fallback's window: DIR renamed aside, not yet replaced: it comes back first.
  fs::rename(d, p / ".m.diffattn-old-qqqqqq");
  {
    DirectoryUpdate u(d.string());
    u.write("config.json", "newest");
    u.commit([](const std::string& n) { return n == "config.json"; });
  }
  EXPECT_EQ(entries(d), (std::vector<std::string>{"config.json", "mine", "moved"}));
  EXPECT_EQ(text_of(d / "config.json"), "newest");
  EXPECT_EQ(entries(p), std::vector<std::string>{"m"});
}

// ---- tokenizers ----

TEST(TokenizerReader, SentencePieceFromBytesOrPath) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "in the beginning was the word and the word was with god\n";
  data::train_sentencepiece(text, d / "tokenizer.model", 300, 1);
  const auto from_path = data::load_sentencepiece(d / "tokenizer.model");
  const auto from_bytes = data::parse_sentencepiece(read_file(d / "tokenizer.model"), "mem");
  EXPECT_EQ(from_path->vocab_size(), from_bytes->vocab_size());
  EXPECT_GE(from_path->vocab_size(), 256);
  EXPECT_EQ(from_path->encode("the word"), from_bytes->encode("the word"));
  expect_error<IoError>([] { data::parse_sentencepiece("\x0a\xff\xff", "bad.model"); },
                        {"bad.model: not a SentencePiece model"});
  expect_error<IoError>([] { data::parse_sentencepiece("", "empty.model"); }, {"empty.model"});
  // A piece with empty text made libsentencepiece's trie builder throw through the caller
  // (fuzz/corpus/tokenizer/crash_empty_piece); a malformed message is named too.
  expect_error<IoError>([] { data::parse_sentencepiece(std::string("\x0a\x07\x0a\x00\x15\x00\x00\x00\x00", 9), "e.model"); },
                        {"e.model: piece 0 of the SentencePiece model is empty"});
  expect_error<IoError>([] { data::parse_sentencepiece(std::string("\x0a\x09\x0a\x01", 4), "m.model"); },
                        {"m.model: not a SentencePiece model (malformed protobuf at byte 0)"});
  ASSERT_EQ(::mkfifo((d / "fifo.model").c_str(), 0600), 0);
  expect_error<IoError>([&] { data::load_sentencepiece(d / "fifo.model"); }, {"not a regular file (a FIFO)"});
}

}  // namespace
}  // namespace diffattn
