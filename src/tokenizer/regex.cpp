#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace lmx::tok {

namespace {

// Oniguruma's \s is the White_Space property; PCRE2 10.42's UCP \s lacks U+0085.
constexpr std::string_view kSpaceClass =
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}";
// `tokenizers` links an Oniguruma with Unicode 16 tables, PCRE2 10.42 has Unicode 14: these are
// the letters, numbers and word characters assigned in Unicode 15.0-16.0 (CJK extensions H and I,
// Kawi, Garay, ...), appended to the PCRE2 classes so both agree on every code point.
constexpr std::string_view kLetterClass =
    "\\p{L}"
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
    "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"
    "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}"
    "\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}"
    "\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}"
    "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}"
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}"
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";
constexpr std::string_view kNumberClass =
    "\\p{N}"
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}";
// Oniguruma's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation, and the
// Latin-1 superscripts and fractions.
constexpr std::string_view kWordClass =
    "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
    "\\x{897}\\x{CF3}\\x{ECE}\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}"
    "\\x{105C0}-\\x{105F3}\\x{10D40}-\\x{10D65}\\x{10D69}-\\x{10D6D}\\x{10D6F}-\\x{10D85}"
    "\\x{10EC2}-\\x{10EC4}\\x{10EFC}-\\x{10EFF}\\x{1123F}-\\x{11241}\\x{11380}-\\x{11389}"
    "\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}-\\x{113C0}\\x{113C2}\\x{113C5}"
    "\\x{113C7}-\\x{113CA}\\x{113CC}-\\x{113D3}\\x{113E1}-\\x{113E2}\\x{116D0}-\\x{116E3}"
    "\\x{11BC0}-\\x{11BE0}\\x{11BF0}-\\x{11BF9}\\x{11F00}-\\x{11F10}\\x{11F12}-\\x{11F3A}"
    "\\x{11F3E}-\\x{11F42}\\x{11F50}-\\x{11F5A}\\x{1342F}\\x{13440}-\\x{13455}"
    "\\x{13460}-\\x{143FA}\\x{16100}-\\x{16139}\\x{16D40}-\\x{16D6C}\\x{16D70}-\\x{16D79}"
    "\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1CCF0}-\\x{1CCF9}\\x{1DF25}-\\x{1DF2A}"
    "\\x{1E030}-\\x{1E06D}\\x{1E08F}\\x{1E4D0}-\\x{1E4F9}\\x{1E5D0}-\\x{1E5FA}\\x{2B739}"
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";
constexpr std::string_view kHexClass = "0-9a-fA-F";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

// Per-thread match scratch: match data for one pair (only the whole match is used) and a JIT
// stack large enough for long runs of whitespace or letters.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(size_t{64} << 10, size_t{16} << 20, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  auto add_class = [&](std::string_view members, bool negated) {
    if (in_class) {
      out.append(members);
    } else {
      out.append(negated ? "[^" : "[");
      out.append(members);
      out.push_back(']');
    }
  };
  size_t i = 0;
  while (i < p.size()) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      // A negated class escape inside [...] cannot be expanded; PCRE2's own is kept there.
      if (e == 's' || (e == 'S' && !in_class)) {
        add_class(kSpaceClass, e == 'S');
      } else if (e == 'w' || (e == 'W' && !in_class)) {
        add_class(kWordClass, e == 'W');
      } else if (e == 'h' || (e == 'H' && !in_class)) {
        add_class(kHexClass, e == 'H');
      } else if ((e == 'p' || e == 'P') && p.substr(i + 2, 1) == "{" &&
                 p.find('}', i + 3) != std::string_view::npos) {
        size_t close = p.find('}', i + 3);
        std::string_view name = p.substr(i + 3, close - i - 3);
        bool negated = e == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.remove_prefix(1);
        }
        std::string_view members = name == "L" ? kLetterClass : name == "N" ? kNumberClass : "";
        if (members.empty() || (negated && in_class)) {
          out.append(p.substr(i, close + 1 - i));
        } else {
          add_class(members, negated);
        }
        i = close + 1;
        continue;
      } else {
        size_t len = 1 + utf8_seq_len(static_cast<unsigned char>(e));
        out.append(p.substr(i, len));
        i += len;
        continue;
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);  // literal ']' first in a class
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

Regex::Regex(std::string_view pattern) : pattern_(pattern) {
  std::string translated = onig_to_pcre2(pattern);
  pcre2_compile_context* cctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_offset, cctx);
  pcre2_compile_context_free(cctx);
  if (!code) {
    fail("regex", "invalid pattern, expected one PCRE2 accepts, got \"", pattern,
         "\": ", pcre2_message(err), " at offset ", err_offset);
  }
  // JIT is an optimization: when unavailable pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto owned = std::make_shared<Code>();
  owned->code = code;
  code_ = std::move(owned);
}

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  MatchScratch& s = scratch();
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t n = subject.size();
  size_t start = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (start <= n) {
    int rc = pcre2_match(code_->code, data, n, start, PCRE2_NO_UTF_CHECK, s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("tokenizer", "regex /", pattern_, "/ failed: ", pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    size_t ms = ov[0], me = ov[1];
    if (ms == me && have_last && me == last_end) {
      // An empty match right where the previous one ended is skipped (no progress otherwise).
      if (start >= n) break;
      start += utf8_seq_len(static_cast<unsigned char>(subject[start]));
      continue;
    }
    out.emplace_back(ms, me);
    have_last = true;
    last_end = me;
    start = me;
  }
}

bool Regex::search(std::string_view subject) const {
  MatchScratch& s = scratch();
  int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
                       PCRE2_NO_UTF_CHECK, s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("tokenizer", "regex /", pattern_, "/ failed: ", pcre2_message(rc));
  return true;
}

}  // namespace lmx::tok
