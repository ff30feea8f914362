// mlx-lm's ArraysCache (models/cache.py) as the linear-attention layers of the Qwen3-Next /
// Qwen3.5 hybrids use it: slot 0 the causal-conv state (B, kernel - 1, conv_dim), slot 1 the
// gated-DeltaNet recurrent state (B, Hv, Dv, Dk) float32. The state summarises every token seen,
// so it cannot drop a tail: trim, speculative rollback and prefix reuse of a shorter prefix are
// refused (PromptCacheLRU reuses it only when the cached tokens are a prefix of the prompt).
#pragma once

#include <array>
#include <optional>

#include "cache/kv_cache.h"

namespace lmx {

class ArraysCache : public KVCacheBase {
 public:
  static constexpr int kSize = 2;

  const std::optional<mx::array>& operator[](int i) const { return arrays_.at(i); }
  void set(int i, mx::array a) { arrays_.at(i) = std::move(a); }
  // mlx-lm's advance(N): lmx also counts the tokens the state has seen (its offset).
  void advance(int n) { offset_ += n; }

  // Not a K/V cache: throws (the linear-attention layer reads and writes the slots).
  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                   const mx::array& values) override;
  int offset() const override { return offset_; }
  bool is_trimmable() const override { return false; }
  // n > 0 throws: a recurrent state cannot forget its last tokens.
  int trim(int n, bool bypass = false) override;
  // make_mask without left padding or lengths: none.
  Mask make_mask(int n, std::optional<int> window = std::nullopt,
                 bool return_array = false) const override;
  std::vector<mx::array> state() const override;
  size_t nbytes() const override;

  // load_prompt_cache: the slots as saved (unset = None) and the token count.
  void set_state(std::optional<mx::array> conv, std::optional<mx::array> recurrent, int offset);

 private:
  std::array<std::optional<mx::array>, kSize> arrays_;
  int offset_ = 0;
};

}  // namespace lmx
