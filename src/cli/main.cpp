// The diffattn command-line tool: dispatches to the subcommands that registered themselves
// (one file each under src/cli/). Errors print one line naming what is wrong and exit non-zero.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/args.h"
#include "diffattn/kernels/runtime.h"

namespace {

void print_usage() {
  using diffattn::cli::commands;
  std::vector<diffattn::cli::Command> cmds = commands();
  std::sort(cmds.begin(), cmds.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  std::cout << "usage: diffattn <command> [options]\n\n"
               "diffattn: differential attention (arXiv:2410.05258) and the Differential\n"
               "Transformer, exact and fast on CPU.\n\ncommands:\n";
  for (const auto& c : cmds) {
    std::cout << "  " << c.name << std::string(c.name.size() < 12 ? 12 - c.name.size() : 1, ' ')
              << c.summary << "\n";
  }
  std::cout << "\nglobal options (before or after the command):\n"
               "  --threads N   threads for the kernels and BLAS (default: DIFFATTN_NUM_THREADS,\n"
               "                else every hardware thread)\n"
               "\n`diffattn <command> --help` describes a command's options.\n";
}

}  // namespace

// Removes the global --threads N (or --threads=N) from args and applies it.
void take_threads(std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    size_t n = 0;
    if (args[i] == "--threads") {
      if (i + 1 >= args.size()) throw diffattn::cli::UsageError("--threads needs a value (N)");
      value = args[i + 1];
      n = 2;
    } else if (args[i].rfind("--threads=", 0) == 0) {
      value = args[i].substr(10);
      n = 1;
    } else {
      continue;
    }
    size_t used = 0;
    int t = 0;
    try {
      t = std::stoi(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != value.size() || t < 1) {
      throw diffattn::cli::UsageError("--threads expects a whole number >= 1, got \"" + value + "\"");
    }
    diffattn::kernels::set_num_threads(t);
    args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i + n));
    --i;
  }
}

// Idle OpenMP threads spin for a while before they sleep. On a busy machine that steals the
// cycles the working threads need: with two other busy processes on the 2-core development VM,
// a 100-step tiny-model training run took a median 20.5 s with passive workers against 34.5 s
// with a short spin. On a quiet machine spinning wins: 1.3x for that run, 2.2x for decoding a
// small model token by token (every layer's parallel regions wake sleeping threads). So the
// tool waits passively only when the machine is already busy at start-up: its one-minute load
// average at least half its processors. libgomp reads OMP_WAIT_POLICY when it loads, before
// main, so the tool sets it and runs itself again once. A policy the user set is always kept.
bool machine_busy() {
  double load[1] = {0};
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  return ::getloadavg(load, 1) == 1 && cpus > 0 && load[0] >= 0.5 * static_cast<double>(cpus);
}

void prefer_passive_waiting_when_busy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || !machine_busy()) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: go on with the default policy
}

int main(int argc, char** argv) {
  using namespace diffattn;
  prefer_passive_waiting_when_busy(argv);
  std::vector<std::string> all(argv + 1, argv + argc);
  try {
    take_threads(all);
    kernels::num_threads();  // reads DIFFATTN_NUM_THREADS now, so a bad value fails before any work
  } catch (const std::exception& e) {
    std::cerr << "diffattn: " << e.what() << "\n";
    return 2;
  }
  std::vector<char*> kept{argv[0]};
  for (std::string& a : all) kept.push_back(a.data());
  argc = static_cast<int>(kept.size());
  argv = kept.data();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::cout << "diffattn " DIFFATTN_VERSION "\n";
    return 0;
  }
  const std::string name = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  for (const auto& c : cli::commands()) {
    if (c.name != name) continue;
    try {
      return c.run(rest);
    } catch (const cli::UsageError& e) {
      std::cerr << "diffattn " << name << ": " << e.what() << "\n";
      return 2;
    } catch (const std::bad_alloc&) {
      // Sizes from flags and files are checked before they are allocated; this is what is left.
      std::cerr << "diffattn " << name << ": error: out of memory (an allocation failed; lower "
                   "the sizes given: --batch, --seq-len, the model's size or the input's)\n";
      return 1;
    } catch (const std::length_error& e) {
      std::cerr << "diffattn " << name << ": error: a size is too large (" << e.what()
                << "); lower the sizes given\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "diffattn " << name << ": error: " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << "diffattn: unknown command \"" << name << "\" (see diffattn --help)\n";
  return 2;
}
