// Command-line parsing for the diffattn tool: each command declares its options with defaults
// and help, then reads them typed. Unknown options and malformed values are UsageErrors that
// name the option; `--help` prints the command's help.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "diffattn/base/error.h"

namespace diffattn::cli {

// A command line the tool cannot run: an unknown option, a missing or malformed value, a value
// out of range. The tool exits with status 2 for it (docs/cli.md, "Exit status"); any other
// error (a file, a model, the machine) exits with status 1.
class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// Runs f, which checks values that came from flags with the library's own parsers
// (parse_dtype(a.str("--dtype"), "--dtype"), a task's validate()), and reports an
// InvalidArgument it throws as the UsageError it is. Errors of files (IoError) pass unchanged.
template <class F>
auto from_flags(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const UsageError&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

class Args {
 public:
  Args(std::string command, std::string summary);

  // --name VALUE (or --name=VALUE), with a default; metavar names the value in the help.
  Args& option(const std::string& name, const std::string& metavar, const std::string& def,
               const std::string& help);
  // --name, a boolean switch.
  Args& flag(const std::string& name, const std::string& help);
  // A positional argument, in declaration order.
  Args& positional(const std::string& name, const std::string& help, bool required = true);
  // Free text printed after the options in --help.
  Args& epilog(const std::string& text);

  // Parses argv (without the program and command names). Returns false when --help was
  // asked for (the help is printed). Throws UsageError on anything unknown or malformed.
  bool parse(const std::vector<std::string>& argv);

  bool given(const std::string& name) const;
  const std::string& str(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  // The same, and a UsageError naming the option when the value is outside [lo, hi].
  int64_t integer(const std::string& name, int64_t lo, int64_t hi) const;
  double number(const std::string& name, double lo, double hi) const;
  // A comma-separated list of integers, each within [lo, hi] (at least one).
  std::vector<int64_t> integers(const std::string& name, int64_t lo, int64_t hi) const;
  bool on(const std::string& name) const;
  std::string help() const;
  const std::string& command() const { return command_; }

 private:
  struct Spec {
    std::string name, metavar, def, help;
    bool is_flag = false, positional = false, required = false;
  };
  const Spec& spec(const std::string& name) const;

  std::string command_, summary_, epilog_;
  std::vector<Spec> specs_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> given_;
};

// A subcommand of the tool. Commands register themselves with a static CommandRegistration in
// their own file; `diffattn --help` lists them by `order`.
struct Command {
  std::string name;
  std::string summary;
  int order = 100;
  std::function<int(const std::vector<std::string>&)> run;
};

std::vector<Command>& commands();

struct CommandRegistration {
  explicit CommandRegistration(Command c) { commands().push_back(std::move(c)); }
};

}  // namespace diffattn::cli
