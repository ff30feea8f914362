#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <memory>

#include "core/error.h"

namespace lmx::tok {

char32_t next_codepoint(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  unsigned char c = p[0];
  if (c < 0x80) {
    i += 1;
    return c;
  }
  // A sequence cut off by the end of the text (only invalid UTF-8 has one: a template's string
  // literal, say) reads as U+FFFD, one byte at a time, never past the end.
  const size_t n = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (s.size() - i < n) {
    i += 1;
    return 0xFFFD;
  }
  if (c < 0xE0) {
    i += 2;
    return (char32_t(c & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (c < 0xF0) {
    i += 3;
    return (char32_t(c & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  i += 4;
  return (char32_t(c & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
         (p[3] & 0x3F);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t count_codepoints(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

// Code point ranges [first, last], sorted.
struct CodeRange {
  char32_t first, last;
};

template <size_t N>
bool in_ranges(char32_t cp, const CodeRange (&ranges)[N]) {
  const CodeRange* it = std::upper_bound(
      ranges, ranges + N, cp, [](char32_t c, const CodeRange& r) { return c < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

// utf8proc 2.8 has Unicode 15 data, Rust's char::is_numeric (used by Digits) Unicode 16: the
// numbers assigned since.
constexpr CodeRange kNewerNumbers[] = {{0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9},
                                       {0x11DE0, 0x11DE9}, {0x16130, 0x16139}, {0x16D70, 0x16D79},
                                       {0x16FF4, 0x16FF6}, {0x1CCF0, 0x1CCF9}, {0x1E5F1, 0x1E5FA}};

// `tokenizers`' StripAccents takes marks from its pre-Unicode-12 tables: the marks it does not
// strip, and characters it strips that are no longer marks.
constexpr CodeRange kMarksNotStripped[] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},
    {0xAFA, 0xAFF},     {0xB55, 0xB55},     {0xC04, 0xC04},     {0xC3C, 0xC3C},
    {0xCF3, 0xCF3},     {0xD00, 0xD00},     {0xD3B, 0xD3C},     {0xD81, 0xD81},
    {0xEBA, 0xEBA},     {0xECE, 0xECE},     {0x1715, 0x1715},   {0x180F, 0x180F},
    {0x1ABF, 0x1ACE},   {0x1CF7, 0x1CF7},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},
    {0xA8FF, 0xA8FF},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF},
    {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x11073, 0x11074},
    {0x110C2, 0x110C2}, {0x11145, 0x11146}, {0x111C9, 0x111C9}, {0x111CE, 0x111CF},
    {0x11241, 0x11241}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x1182C, 0x1183A},
    {0x11930, 0x11935}, {0x11937, 0x11938}, {0x1193B, 0x1193E}, {0x11940, 0x11940},
    {0x11942, 0x11943}, {0x119D1, 0x119D7}, {0x119DA, 0x119E0}, {0x119E4, 0x119E4},
    {0x11A01, 0x11A0A}, {0x11A33, 0x11A39}, {0x11A3B, 0x11A3E}, {0x11A47, 0x11A47},
    {0x11A51, 0x11A5B}, {0x11A8A, 0x11A99}, {0x11D31, 0x11D36}, {0x11D3A, 0x11D3A},
    {0x11D3C, 0x11D3D}, {0x11D3F, 0x11D45}, {0x11D47, 0x11D47}, {0x11D8A, 0x11D8E},
    {0x11D90, 0x11D91}, {0x11D93, 0x11D97}, {0x11EF3, 0x11EF6}, {0x11F00, 0x11F01},
    {0x11F03, 0x11F03}, {0x11F34, 0x11F3A}, {0x11F3E, 0x11F42}, {0x13440, 0x13440},
    {0x13447, 0x13455}, {0x16F4F, 0x16F4F}, {0x16F7F, 0x16F87}, {0x16FE4, 0x16FE4},
    {0x16FF0, 0x16FF1}, {0x1CF00, 0x1CF2D}, {0x1CF30, 0x1CF46}, {0x1E08F, 0x1E08F},
    {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}};
constexpr CodeRange kFormerMarks[] = {{0x1CF2, 0x1CF3}};

// `tokenizers`' normalization tables predate Unicode 12: these code points, which utf8proc can
// decompose, reorder or compose, are unassigned there and so left alone, acting as starters
// (U+11930 only composes, with U+11935 into U+11938).
constexpr CodeRange kUnknownToNormalizer[] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},
    {0xC3C, 0xC3C},     {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},
    {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0x32FF, 0x32FF},   {0xA7F2, 0xA7F4},
    {0xA82C, 0xA82C},   {0xAB69, 0xAB69},   {0x10781, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF},
    {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B},
    {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x11930, 0x11930}, {0x11938, 0x11938},
    {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34},
    {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45},
    {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E030, 0x1E06D},
    {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E4EC, 0x1E4EF}, {0x1F16C, 0x1F16C}, {0x1FBF0, 0x1FBF9}};

// Rust's char::to_lowercase has Unicode 16 data, utf8proc 2.8 Unicode 15: the mappings added since.
struct CaseMapping {
  char32_t from, to;
};
constexpr CaseMapping kNewerLowercase[] = {
    {0x1C89, 0x1C8A},   {0xA7CB, 0x264},    {0xA7CC, 0xA7CD},   {0xA7CE, 0xA7CF},
    {0xA7D2, 0xA7D3},   {0xA7D4, 0xA7D5},   {0xA7DA, 0xA7DB},   {0xA7DC, 0x19B},
    {0x10D50, 0x10D70}, {0x10D51, 0x10D71}, {0x10D52, 0x10D72}, {0x10D53, 0x10D73},
    {0x10D54, 0x10D74}, {0x10D55, 0x10D75}, {0x10D56, 0x10D76}, {0x10D57, 0x10D77},
    {0x10D58, 0x10D78}, {0x10D59, 0x10D79}, {0x10D5A, 0x10D7A}, {0x10D5B, 0x10D7B},
    {0x10D5C, 0x10D7C}, {0x10D5D, 0x10D7D}, {0x10D5E, 0x10D7E}, {0x10D5F, 0x10D7F},
    {0x10D60, 0x10D80}, {0x10D61, 0x10D81}, {0x10D62, 0x10D82}, {0x10D63, 0x10D83},
    {0x10D64, 0x10D84}, {0x10D65, 0x10D85}, {0x16EA0, 0x16EBB}, {0x16EA1, 0x16EBC},
    {0x16EA2, 0x16EBD}, {0x16EA3, 0x16EBE}, {0x16EA4, 0x16EBF}, {0x16EA5, 0x16EC0},
    {0x16EA6, 0x16EC1}, {0x16EA7, 0x16EC2}, {0x16EA8, 0x16EC3}, {0x16EA9, 0x16EC4},
    {0x16EAA, 0x16EC5}, {0x16EAB, 0x16EC6}, {0x16EAC, 0x16EC7}, {0x16EAD, 0x16EC8},
    {0x16EAE, 0x16EC9}, {0x16EAF, 0x16ECA}, {0x16EB0, 0x16ECB}, {0x16EB1, 0x16ECC},
    {0x16EB2, 0x16ECD}, {0x16EB3, 0x16ECE}, {0x16EB4, 0x16ECF}, {0x16EB5, 0x16ED0},
    {0x16EB6, 0x16ED1}, {0x16EB7, 0x16ED2}, {0x16EB8, 0x16ED3}};

// How the bytes at s[i..] start a UTF-8 sequence: `valid` bytes fit the sequence so far and
// `need` is its full length. valid == need means a complete character; valid < need with
// i + valid == size means the input ended inside it; otherwise byte i + valid does not fit
// (the Unicode "maximal subpart" of an ill-formed sequence is s[i, i + max(valid, 1))).
struct SeqCheck {
  size_t need;
  size_t valid;
};

SeqCheck check_sequence(const unsigned char* s, size_t size, size_t i) {
  unsigned char c = s[i];
  if (c < 0x80) return {1, 1};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    return {1, 0};  // continuation byte or a lead that can never start a sequence
  }
  size_t valid = 1;
  while (valid < need && i + valid < size) {
    unsigned char b = s[i + valid];
    bool ok = valid == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++valid;
  }
  return {need, valid};
}

}  // namespace

size_t find_invalid_utf8(std::string_view sv) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  size_t i = 0, n = sv.size();
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    SeqCheck c = check_sequence(s, n, i);
    if (c.valid != c.need) return i;
    i += c.need;
  }
  return std::string_view::npos;
}

size_t append_utf8_lossy(std::string_view sv, bool final, std::string& out) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  size_t i = 0, n = sv.size();
  while (i < n) {
    size_t run = i;
    while (run < n && s[run] < 0x80) ++run;
    if (run > i) {
      out.append(sv.substr(i, run - i));
      i = run;
      if (i == n) break;
    }
    SeqCheck c = check_sequence(s, n, i);
    if (c.valid == c.need) {
      out.append(sv.substr(i, c.need));
      i += c.need;
    } else if (i + c.valid == n && c.valid > 0 && !final) {
      break;  // may still be completed by the next bytes
    } else {
      out.append(kReplacement);
      i += c.valid > 0 ? c.valid : 1;
    }
  }
  return i;
}

bool is_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_numeric(char32_t cp) {
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
         cat == UTF8PROC_CATEGORY_NO || in_ranges(cp, kNewerNumbers);
}

bool is_mark(char32_t cp) {
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  bool mark =
      cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
  return mark ? !in_ranges(cp, kMarksNotStripped) : in_ranges(cp, kFormerMarks);
}

namespace {

std::string utf8proc_normalize(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::NFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::NFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::NFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                      utf8proc_ssize_t(s.size()), &dst, utf8proc_option_t(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(dst, &std::free);
  if (len < 0) fail("tokenizer", "unicode normalization failed: ", utf8proc_errmsg(len));
  return std::string(reinterpret_cast<const char*>(dst), size_t(len));
}

}  // namespace

std::string normalize_unicode(std::string_view s, NormalForm form) {
  // ASCII is invariant under every normal form; most text takes this path.
  if (std::all_of(s.begin(), s.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(s);
  }
  // Code points the reference tables do not know split the text: each run between them is
  // normalized on its own and they are copied unchanged.
  std::string out;
  size_t run = 0, i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t cp = next_codepoint(s, i);
    if (cp < kUnknownToNormalizer[0].first || !in_ranges(cp, kUnknownToNormalizer)) continue;
    out += utf8proc_normalize(s.substr(run, start - run), form);
    out.append(s.substr(start, i - start));
    run = i;
  }
  if (run == 0) return utf8proc_normalize(s, form);
  out += utf8proc_normalize(s.substr(run), form);
  return out;
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? char(c + 32) : char(c));
      ++i;
      continue;
    }
    char32_t cp = next_codepoint(s, i);
    if (cp == 0x130) {
      // The one unconditional multi-character lowercase mapping (SpecialCasing.txt).
      out.append("i\xCC\x87");
      continue;
    }
    const CaseMapping* m =
        std::lower_bound(std::begin(kNewerLowercase), std::end(kNewerLowercase), cp,
                         [](const CaseMapping& e, char32_t c) { return e.from < c; });
    if (m != std::end(kNewerLowercase) && m->from == cp) {
      append_utf8(out, m->to);
    } else {
      append_utf8(out, char32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
    }
  }
  return out;
}

}  // namespace lmx::tok
