// The machine's memory (see runtime.h): what sizes read from outside input are checked against.
// In diffattn_files, below the kernels, because the file readers check sizes against it too.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "diffattn/error.h"
#include "diffattn/runtime.h"

namespace diffattn {

int64_t memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

void check_fits_in_memory(double bytes, const std::string& what) {
  const double have = static_cast<double>(memory_bytes());
  if (have <= 0 || bytes <= have) return;
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
    return std::string(buf);
  };
  throw InvalidArgument(what + " needs about " + gib(bytes) + ", more than this machine's " +
                        gib(have) + " of memory");
}

}  // namespace diffattn
