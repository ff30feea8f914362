#include "cli/flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace lmx::cli {

Flags::Flags(std::string command, std::string summary, std::vector<FlagSpec> specs)
    : command_(std::move(command)), summary_(std::move(summary)), specs_(std::move(specs)) {}

bool Flags::parse(const std::vector<std::string>& args) {
  const std::string where = "lmx " + command_;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "-h" || a == "--help") return false;
    check(a.rfind("--", 0) == 0 || (a.size() == 2 && a[0] == '-'), where, "unexpected argument '",
          a, "' (see --help)");
    std::string name = a.substr(a[1] == '-' ? 2 : 1);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    std::replace(name.begin(), name.end(), '_', '-');
    const FlagSpec* spec = nullptr;
    for (const auto& s : specs_)
      if (s.name == name) spec = &s;
    check(spec != nullptr, where, "unknown flag '", a, "' (see --help)");
    if (spec->is_switch) {
      check(!value, where, "flag --", name, " takes no value");
      // GCC 12 reports a false -Wrestrict for a literal assigned into the map (GCC bug 105329).
      values_.insert_or_assign(name, std::string(1, '1'));
      continue;
    }
    if (!value) {
      check(i + 1 < args.size(), where, "flag --", name, " needs a value");
      value = args[++i];
    }
    values_[name] = *value;
    all_[name].push_back(*value);
  }
  return true;
}

std::string Flags::usage() const {
  std::ostringstream os;
  os << "usage: lmx " << command_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
  for (const auto& s : specs_) {
    std::string left =
        "  --" + s.name + (s.is_switch ? "" : " " + (s.metavar.empty() ? "V" : s.metavar));
    os << left;
    for (size_t i = left.size(); i < 30; ++i) os << ' ';
    os << ' ' << s.help;
    if (!s.default_text.empty()) os << " (default: " << s.default_text << ")";
    os << '\n';
  }
  os << "  -h, --help                     show this help\n";
  return os.str();
}

std::string Flags::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::vector<std::string> Flags::all(const std::string& name) const {
  auto it = all_.find(name);
  return it == all_.end() ? std::vector<std::string>{} : it->second;
}

std::string Flags::required(const std::string& name) const {
  auto it = values_.find(name);
  check(it != values_.end(), "lmx " + command_, "missing required flag --", name);
  return it->second;
}

std::optional<int> Flags::opt_integer(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  int v = 0;
  const std::string& s = it->second;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  check(ec == std::errc() && p == s.data() + s.size(), "lmx " + command_, "flag --", name,
        " expects an integer, got '", s, "'");
  return v;
}

int Flags::integer(const std::string& name, int fallback) const {
  return opt_integer(name).value_or(fallback);
}

std::optional<float> Flags::opt_number(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  const std::string& s = it->second;
  char* end = nullptr;
  float v = std::strtof(s.c_str(), &end);
  check(!s.empty() && end == s.c_str() + s.size() && std::isfinite(v), "lmx " + command_, "flag --",
        name, " expects a number, got '", s, "'");
  return v;
}

float Flags::number(const std::string& name, float fallback) const {
  return opt_number(name).value_or(fallback);
}

}  // namespace lmx::cli
