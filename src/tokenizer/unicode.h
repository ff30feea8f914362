// UTF-8 and Unicode helpers shared by the tokenizer pieces. Semantics follow Rust's std (which the
// `tokenizers` library uses): char::is_whitespace, char::is_numeric, String::from_utf8_lossy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lmx::tok {

// Length of the UTF-8 sequence starting with `lead` (1 for continuation/invalid bytes, so that
// loops over already validated text can never stall).
inline size_t utf8_seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the code point at s[i] of valid UTF-8 and advances i past it.
char32_t next_codepoint(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
// Number of code points in valid UTF-8.
size_t count_codepoints(std::string_view s);

// Byte offset of the first invalid UTF-8 sequence (incomplete, overlong, surrogate, > U+10FFFF),
// or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);
inline bool is_valid_utf8(std::string_view s) {
  return find_invalid_utf8(s) == std::string_view::npos;
}

// Appends `bytes` to `out` as text, replacing each maximal invalid subsequence by U+FFFD exactly
// like Rust's String::from_utf8_lossy. With `final` false an incomplete sequence at the end (one
// that later bytes could still complete) is left unconsumed. Returns the bytes consumed.
size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out);

bool is_whitespace(char32_t cp);  // Unicode White_Space
bool is_numeric(char32_t cp);     // general category Nd, Nl or No (Unicode 16)
// Mn, Mc or Me as `tokenizers`' StripAccents sees them (its tables predate Unicode 12).
bool is_mark(char32_t cp);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
// utf8proc's normalization, except for the few code points `tokenizers`' older tables lack.
std::string normalize_unicode(std::string_view s, NormalForm form);
// Per-character full lowercase mapping (Rust char::to_lowercase: no final-sigma context).
std::string lowercase(std::string_view s);

}  // namespace lmx::tok
