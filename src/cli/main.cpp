// The diffattn command-line tool: dispatches to the subcommands that registered themselves
// (one file each under src/cli/). Errors print one line naming what is wrong and exit non-zero.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "cli/args.h"

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
  std::cout << "\n`diffattn <command> --help` describes a command's options.\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace diffattn;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::cout << "diffattn 0.1.0\n";
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
    } catch (const std::exception& e) {
      std::cerr << "diffattn " << name << ": error: " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << "diffattn: unknown command \"" << name << "\" (see diffattn --help)\n";
  return 2;
}
