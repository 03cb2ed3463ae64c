// Thread count of the library (see include/diffattn/kernels/runtime.h). OpenMP regions read it through
// omp_set_num_threads; BLAS wrappers read num_threads() before their calls.
#include "diffattn/kernels/runtime.h"

#include <omp.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "diffattn/base/error.h"

namespace diffattn::kernels {

namespace {

int initial_threads() {
  const char* env = std::getenv("DIFFATTN_NUM_THREADS");
  if (env != nullptr && *env != '\0') {
    errno = 0;
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (*end != '\0' || errno != 0 || n < 1 || n > 4096) {
      throw InvalidArgument(std::string("DIFFATTN_NUM_THREADS is \"") + env +
                            "\", expected a whole number from 1 to 4096");
    }
    omp_set_num_threads(static_cast<int>(n));
    return static_cast<int>(n);
  }
  return omp_get_max_threads();
}

std::atomic<int>& threads() {
  static std::atomic<int> n{initial_threads()};
  return n;
}

}  // namespace

int num_threads() { return threads().load(); }

void set_num_threads(int n) {
  if (n < 1) throw InvalidArgument("thread count must be at least 1, got " + std::to_string(n));
  threads().store(n);
  omp_set_num_threads(n);
}

bool idle_threads_sleep() {
  static const bool passive = [] {
    const char* p = std::getenv("OMP_WAIT_POLICY");
    return p != nullptr && (p[0] == 'p' || p[0] == 'P');
  }();
  return passive;
}

}  // namespace diffattn::kernels
