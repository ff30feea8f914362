// PCRE2 (JIT, UTF + UCP) regexes behaving like the Oniguruma ones `tokenizers` compiles:
// the pattern is rewritten so that \s, \w and \h mean what they mean in Oniguruma, '^'/'$' match
// at line boundaries, and iteration over matches skips empty matches the way onig's does.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lmx::tok {

class Regex {
 public:
  // Throws lmx::Error("regex", ...) when the pattern does not compile.
  explicit Regex(std::string_view pattern);

  // Non-overlapping matches, left to right, as [start, end) byte offsets. `subject` must be
  // valid UTF-8 (not re-checked).
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;
  // True if the pattern matches somewhere in subject.
  bool search(std::string_view subject) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

// Rewrites Oniguruma-only class escapes into PCRE2 syntax (exposed for tests).
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace lmx::tok
