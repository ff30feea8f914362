// A small flag parser for the subcommands: --name value, --name=value, boolean switches,
// unknown flags and bad numbers are errors naming the flag.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lmx::cli {

struct FlagSpec {
  std::string name;  // without dashes
  std::string help;
  bool is_switch = false;
  std::string metavar = "";
  std::string default_text = "";
};

class Flags {
 public:
  Flags(std::string command, std::string summary, std::vector<FlagSpec> specs);
  // Throws lmx::Error on unknown flags or missing values. Returns false if --help was given.
  bool parse(const std::vector<std::string>& args);
  std::string usage() const;
  void add(FlagSpec spec) { specs_.push_back(std::move(spec)); }

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name, const std::string& fallback = "") const;
  std::string required(const std::string& name) const;
  int integer(const std::string& name, int fallback) const;
  std::optional<int> opt_integer(const std::string& name) const;
  float number(const std::string& name, float fallback) const;
  std::optional<float> opt_number(const std::string& name) const;
  bool on(const std::string& name) const { return has(name); }
  // Every value a repeatable flag was given, in order (str() gives the last).
  std::vector<std::string> all(const std::string& name) const;

 private:
  std::string command_, summary_;
  std::vector<FlagSpec> specs_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_;
};

}  // namespace lmx::cli
