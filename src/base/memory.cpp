// The machine's memory (see include/diffattn/base/memory.h): what sizes read from outside input are checked against.
// In diffattn_files, below the kernels, because the file readers check sizes against it too.
// The bound is the smallest of physical memory, the process's RLIMIT_AS and RLIMIT_DATA
// (ulimit -v, -d) and its cgroup's memory limit (a container's): past any of them an
// allocation fails, or the kernel kills the process, instead of the words below.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "diffattn/base/error.h"
#include "diffattn/base/memory.h"

namespace diffattn {

namespace {

// A number in a cgroup file (0 when absent or "max").
double cgroup_value(const std::string& path) {
  double v = 0;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[64] = {0};
    if (std::fgets(buf, sizeof buf, f)) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(buf, &end, 10);
      if (end != buf && n > 0) v = static_cast<double>(n);  // "max" parses as nothing
    }
    std::fclose(f);
  }
  return v;
}

// The memory limit of this process's cgroup (v2 memory.max, or v1 memory.limit_in_bytes, whose
// "no limit" is a number near 2^63 that never binds); 0 when there is none. Inside a container
// the process's own cgroup is usually mounted as the root, so that is tried too.
double cgroup_memory_limit() {
  std::string v2, v1;
  if (FILE* f = std::fopen("/proc/self/cgroup", "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f)) {
      std::string l = line;
      while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
      if (l.rfind("0::", 0) == 0) v2 = l.substr(3);
      const size_t m = l.find(":memory:");
      if (m != std::string::npos) v1 = l.substr(m + 8);
    }
    std::fclose(f);
  }
  auto under = [](const std::string& root, const std::string& rel) {
    return rel.empty() || rel == "/" || rel.find("..") != std::string::npos ? root : root + rel;
  };
  double best = 0;
  for (const std::string& path :
       {under("/sys/fs/cgroup", v2) + "/memory.max", std::string("/sys/fs/cgroup/memory.max"),
        under("/sys/fs/cgroup/memory", v1) + "/memory.limit_in_bytes",
        std::string("/sys/fs/cgroup/memory/memory.limit_in_bytes")}) {
    const double v = cgroup_value(path);
    if (v > 0 && (best == 0 || v < best)) best = v;
  }
  return best;
}

}  // namespace

int64_t memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

void check_fits_in_memory(double bytes, const std::string& what) {
  double have = static_cast<double>(memory_bytes());
  std::string whose = "this machine's";
  auto lower = [&](double limit, const char* name) {
    if (limit > 0 && (have <= 0 || limit < have)) {
      have = limit;
      whose = std::string("this process's limit (") + name + ") of";
    }
  };
  for (const auto& [res, name] : {std::pair{RLIMIT_AS, "ulimit -v"}, std::pair{RLIMIT_DATA, "ulimit -d"}}) {
    rlimit r {};
    if (::getrlimit(res, &r) == 0 && r.rlim_cur != RLIM_INFINITY) lower(static_cast<double>(r.rlim_cur), name);
  }
  lower(cgroup_memory_limit(), "cgroup memory limit");
  if (have <= 0 || bytes <= have) return;
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
    return std::string(buf);
  };
  throw InvalidArgument(what + " needs about " + gib(bytes) + ", more than " + whose + " " +
                        gib(have) + " of memory");
}

}  // namespace diffattn
