// The default corpus: the King James Bible (public domain), printed by Debian's bible-kjv
// package, its "Ge1:1 " references stripped, cached as one verse a line; and any text file.
#include <sys/stat.h>

#include <cstdio>

#include "diffattn/base/files.h"
#include "diffattn/data/data.h"

#ifndef DIFFATTN_DATA_DIR
#define DIFFATTN_DATA_DIR "data"
#endif

namespace diffattn::data {

std::string default_cache_dir() {
  const char* env = std::getenv("DIFFATTN_DATA_DIR");
  if (env != nullptr && *env != '\0') return env;
  return DIFFATTN_DATA_DIR;
}

std::string kjv_text(const std::string& cache_dir) {
  const std::string path = cache_dir + "/kjv.txt";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return read_file(path);
  // Every verse, Genesis 1:1 to Revelation 22:21; stdin closed so `bible` never waits.
  FILE* p = ::popen("bible -f gen1:1-rev22:21 </dev/null 2>/dev/null", "r");
  std::string raw;
  if (p != nullptr) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) raw.append(buf, n);
    ::pclose(p);
  }
  if (raw.size() < 1000000) {
    throw IoError("corpus kjv: the `bible` command (Debian package bible-kjv) gave " +
                  std::to_string(raw.size()) +
                  " bytes; install it with `apt-get install bible-kjv` (scripts/setup.sh does)");
  }
  std::string text;
  text.reserve(raw.size());
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t end = raw.find('\n', pos);
    if (end == std::string::npos) end = raw.size();
    // "Ge1:1 In the beginning..." -> "In the beginning..."
    const size_t space = raw.find(' ', pos);
    const size_t from = (space != std::string::npos && space < end) ? space + 1 : pos;
    text.append(raw, from, end - from);
    text.push_back('\n');
    pos = end + 1;
  }
  make_dirs(cache_dir);
  write_file_atomic(path, text);
  return text;
}

Corpus split_lines(const std::string& name, const std::string& text, int every) {
  Corpus c;
  c.name = name;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    end = end == std::string::npos ? text.size() : end + 1;
    (line % every == every - 1 ? c.valid : c.train).append(text, pos, end - pos);
    pos = end;
    ++line;
  }
  return c;
}

Corpus load_corpus(const std::string& spec, const std::string& cache_dir) {
  if (spec == "kjv") return split_lines("kjv", kjv_text(cache_dir));
  return split_lines(spec, read_file(spec));
}

}  // namespace diffattn::data
