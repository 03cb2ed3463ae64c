// Implementation of the command-line parser (see args.h).
#include "cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace diffattn::cli {

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

Args::Args(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

Args& Args::option(const std::string& name, const std::string& metavar, const std::string& def,
                   const std::string& help) {
  specs_.push_back({name, metavar, def, help});
  values_[name] = def;
  return *this;
}

Args& Args::flag(const std::string& name, const std::string& help) {
  Spec s{name, "", "", help};
  s.is_flag = true;
  specs_.push_back(s);
  values_[name] = "";
  return *this;
}

Args& Args::positional(const std::string& name, const std::string& help, bool required) {
  Spec s{name, name, "", help};
  s.positional = true;
  s.required = required;
  specs_.push_back(s);
  values_[name] = "";
  return *this;
}

Args& Args::epilog(const std::string& text) {
  epilog_ = text;
  return *this;
}

const Args::Spec& Args::spec(const std::string& name) const {
  for (const Spec& s : specs_) {
    if (s.name == name) return s;
  }
  throw UsageError("internal: option " + name + " is not declared for " + command_);
}

bool Args::parse(const std::vector<std::string>& argv) {
  size_t next_positional = 0;
  std::vector<const Spec*> positionals;
  for (const Spec& s : specs_) {
    if (s.positional) positionals.push_back(&s);
  }
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << help();
      return false;
    }
    if (a.rfind("--", 0) == 0) {
      std::string name = a, value;
      bool has_value = false;
      if (const size_t eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        has_value = true;
      }
      const Spec* s = nullptr;
      for (const Spec& c : specs_) {
        if (!c.positional && c.name == name) s = &c;
      }
      if (s == nullptr) {
        throw UsageError("unknown option " + name + " (see diffattn " + command_ + " --help)");
      }
      if (s->is_flag) {
        if (has_value) throw UsageError(name + " takes no value");
        values_[name] = "1";
      } else {
        if (!has_value) {
          if (i + 1 >= argv.size()) throw UsageError(name + " needs a value (" + s->metavar + ")");
          value = argv[++i];
        }
        values_[name] = value;
      }
      given_[name] = true;
      continue;
    }
    if (next_positional >= positionals.size()) {
      throw UsageError("unexpected argument \"" + a + "\" (see diffattn " + command_ + " --help)");
    }
    values_[positionals[next_positional]->name] = a;
    given_[positionals[next_positional]->name] = true;
    ++next_positional;
  }
  for (const Spec* s : positionals) {
    if (s->required && !given(s->name)) throw UsageError("missing argument " + s->name);
  }
  return true;
}

bool Args::given(const std::string& name) const {
  auto it = given_.find(name);
  return it != given_.end() && it->second;
}

const std::string& Args::str(const std::string& name) const {
  spec(name);
  return values_.at(name);
}

namespace {

// s as a whole decimal integer; false (errno ERANGE when out of range) when it is not one.
bool parse_int64(const std::string& s, int64_t& v) {
  errno = 0;
  char* end = nullptr;
  v = std::strtoll(s.c_str(), &end, 10);
  return !s.empty() && *end == '\0' && errno == 0;
}

}  // namespace

int64_t Args::integer(const std::string& name) const {
  const std::string& s = str(name);
  int64_t v = 0;
  if (!parse_int64(s, v)) {
    throw UsageError(name + " expects an integer" +
                     (errno == ERANGE ? " that fits in 64 bits" : std::string()) + ", got \"" + s + "\"");
  }
  return v;
}

double Args::number(const std::string& name) const {
  const std::string& s = str(name);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno != 0 || !std::isfinite(v)) {
    throw UsageError(name + " expects a finite number, got \"" + s + "\"");
  }
  return v;
}

int64_t Args::integer(const std::string& name, int64_t lo, int64_t hi) const {
  const int64_t v = integer(name);
  if (v < lo || v > hi) {
    throw UsageError(name + " must be between " + std::to_string(lo) + " and " +
                     std::to_string(hi) + ", got " + str(name));
  }
  return v;
}

std::vector<int64_t> Args::integers(const std::string& name, int64_t lo, int64_t hi) const {
  const std::string& s = str(name);
  std::vector<int64_t> out;
  size_t at = 0;
  while (true) {
    const size_t comma = s.find(',', at);
    const std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    int64_t v = 0;
    if (!parse_int64(item, v)) {
      throw UsageError(name + " expects integers separated by commas, got \"" + s + "\"");
    }
    if (v < lo || v > hi) {
      throw UsageError(name + ": each value must be between " + std::to_string(lo) + " and " +
                       std::to_string(hi) + ", got " + item);
    }
    out.push_back(v);
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

double Args::number(const std::string& name, double lo, double hi) const {
  const double v = number(name);
  if (v < lo || v > hi) {
    std::ostringstream os;
    os << name << " must be between " << lo << " and " << hi << ", got " << str(name);
    throw UsageError(os.str());
  }
  return v;
}

bool Args::on(const std::string& name) const { return spec(name).is_flag && !str(name).empty(); }

std::string Args::help() const {
  std::ostringstream os;
  os << "usage: diffattn " << command_;
  for (const Spec& s : specs_) {
    if (s.positional) os << (s.required ? " " : " [") << s.name << (s.required ? "" : "]");
  }
  os << " [options]\n\n" << summary_ << "\n";
  bool any_pos = false;
  for (const Spec& s : specs_) any_pos |= s.positional;
  if (any_pos) {
    os << "\narguments:\n";
    for (const Spec& s : specs_) {
      if (s.positional) os << "  " << s.name << "\n      " << s.help << "\n";
    }
  }
  os << "\noptions:\n";
  for (const Spec& s : specs_) {
    if (s.positional) continue;
    os << "  " << s.name;
    if (!s.is_flag) os << ' ' << s.metavar;
    os << "\n      " << s.help;
    if (!s.is_flag && !s.def.empty()) os << " (default: " << s.def << ")";
    os << "\n";
  }
  os << "  --help\n      print this help\n";
  if (!epilog_.empty()) os << "\n" << epilog_ << "\n";
  return os.str();
}

}  // namespace diffattn::cli
