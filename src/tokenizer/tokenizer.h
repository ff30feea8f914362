// Hugging Face tokenizer.json tokenizer (BPE models), matching the `tokenizers` library's
// encode/decode exactly. See docs/tokenizer.md for the supported components.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmx {

namespace tok {
struct TokenizerImpl;
struct DetokenizerState;
}  // namespace tok

class Tokenizer {
 public:
  // Reads <dir>/tokenizer.json and, if present, <dir>/tokenizer_config.json (bos/eos tokens,
  // add_bos_token, chat_template; a chat_template.jinja or chat_template.json next to it is used
  // when the config has none).
  static Tokenizer from_dir(const std::filesystem::path& dir);
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);

  // Throws lmx::Error("[tokenizer] invalid UTF-8 at byte N") for invalid UTF-8 input.
  // Safe to call from several threads at once.
  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids the vocabulary does not know are skipped, like `tokenizers` does.
  std::string decode(const std::vector<int>& ids, bool skip_special_tokens = false) const;

  std::optional<int> token_to_id(std::string_view token) const;
  // Throws lmx::Error for an id outside the vocabulary.
  std::string id_to_token(int id) const;
  int vocab_size() const;  // distinct tokens, added tokens included
  std::optional<int> bos_token_id() const;
  std::vector<int> eos_token_ids() const;  // from tokenizer_config.json eos_token (may be empty)
  // tokenizer_config.json add_bos_token, when given.
  std::optional<bool> add_bos_token() const;
  bool is_special(int id) const;
  const std::string& chat_template() const;  // "" if none

 private:
  explicit Tokenizer(std::shared_ptr<const tok::TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const tok::TokenizerImpl> impl_;
  friend class StreamingDetokenizer;
};

// Incremental detokenizer: add tokens one by one, get the newly completed text. Never emits a
// partial UTF-8 sequence; the concatenation of everything add() returned plus finalize() equals
// decode(all ids). Work per token is constant (only what a later token could still change is
// held back).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tok, bool skip_special_tokens = false);
  ~StreamingDetokenizer();
  StreamingDetokenizer(StreamingDetokenizer&&) noexcept;
  StreamingDetokenizer& operator=(StreamingDetokenizer&&) noexcept;

  void reset();
  std::string add(int id);  // text that became final with this token
  std::string finalize();   // flush the rest; the detokenizer then starts over as after reset()

 private:
  std::shared_ptr<const tok::TokenizerImpl> impl_;
  bool skip_special_;
  std::unique_ptr<tok::DetokenizerState> state_;
};

}  // namespace lmx
