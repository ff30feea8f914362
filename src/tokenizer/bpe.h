// tokenizer.json "model" of type BPE: vocab + ranked merges, applied to each pre-tokenized word
// lowest rank first (leftmost on ties), with optional byte fallback, unknown-token fusing and
// Llama-3 style ignore_merges. Results for short words are cached.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_node.h"

namespace lmx::tok {

// The largest token id a tokenizer.json may use. Tables indexed by id are sized by the largest
// one, so an id near INT32_MAX would ask for 16 GB; real vocabularies stay under 2^20 (Gemma's
// 262,144 is among the largest).
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// Hash/equality allowing string_view lookups in string-keyed maps without allocating.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  explicit BpeModel(const Node& model);

  // Appends the ids of one word.
  void tokenize(std::string_view word, std::vector<int>& out) const;

  std::optional<int> token_to_id(std::string_view token) const;
  // Null for ids the vocab does not contain.
  const std::string* id_to_token(int id) const;
  const StringMap<int>& vocab() const { return vocab_; }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void merge_word(std::string_view word, std::vector<int>& out) const;
  int unk_id() const;

  std::string file_;
  StringMap<int> vocab_;
  std::vector<const std::string*> by_id_;  // points into vocab_ keys; null for holes
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int, 256> byte_ids_{};  // ids of the "<0xXX>" tokens, -1 when absent

  // Filled up to kCacheCapacity entries and then left alone, like `tokenizers`' own cache.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kMaxCachedWord = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable StringMap<std::vector<int>> cache_;
};

}  // namespace lmx::tok
