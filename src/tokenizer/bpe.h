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

// Token strings in one blob, looked up both ways with no allocation per token: id -> key ->
// [begin, end) of the blob, and string -> key through an open-addressing table of key indices.
class VocabTable {
 public:
  // Sizes the tables for `keys` distinct strings of `bytes` bytes in all.
  void reserve(size_t keys, size_t bytes);
  // Like insert_or_assign on a map: a key added again takes the new id.
  void add(std::string_view token, int id);
  // Fills the id -> token index; call once after the last add(). Of keys sharing an id, the first
  // one added is the id's token.
  void index_ids();

  // -1 when absent.
  int find(std::string_view token) const;
  // nullopt for ids no key has.
  std::optional<std::string_view> token(int id) const;
  size_t size() const { return ids_.size(); }        // keys
  size_t id_limit() const { return by_id_.size(); }  // largest id + 1
  size_t bytes() const;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  std::string_view key(uint32_t k) const {
    return std::string_view(blob_).substr(begins_[k], begins_[k + 1] - begins_[k]);
  }
  // Slot of `token`: holds its key index, or kNone where it would go.
  size_t slot(std::string_view token) const;

  std::string blob_;
  std::vector<uint32_t> begins_{0};  // key k is blob_[begins_[k], begins_[k + 1])
  std::vector<int32_t> ids_;         // id of key k
  std::vector<uint32_t> by_id_;      // key index per id, kNone for holes
  std::vector<uint32_t> slots_ = std::vector<uint32_t>(1, kNone);  // key index, or kNone
};

// Merges keyed by the (left, right) id pair, values inline in 12-byte slots: ids and ranks fit in
// 24 bits, so three words hold left, right and rank, each with one byte of the merged id on top.
class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  // Ranks stay below 2^24 - 1, which marks empty slots.
  static constexpr size_t kMaxMerges = (size_t{1} << 24) - 1;

  // Sizes the table for at most `n` distinct pairs.
  void reserve(size_t n);
  // Like insert_or_assign: a pair merged again takes the new value.
  void assign(int left, int right, Merge merge);
  std::optional<Merge> find(int left, int right) const {
    const Slot& s = slots_[slot(uint32_t(left), uint32_t(right))];
    if (s.empty()) return std::nullopt;
    return s.merge();
  }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  static constexpr uint32_t kLow24 = (uint32_t{1} << 24) - 1;
  struct Slot {
    std::array<uint32_t, 3> words;  // left, right, rank; bytes 0, 1, 2 of the merged id on top

    static Slot pack(uint32_t left, uint32_t right, Merge m) {
      uint32_t id = uint32_t(m.new_id);
      return {{left | id << 24, right | (id >> 8) << 24, m.rank | (id >> 16) << 24}};
    }
    static Slot none() { return {{0, 0, kLow24}}; }
    bool empty() const { return (words[2] & kLow24) == kLow24; }
    uint32_t left() const { return words[0] & kLow24; }
    uint32_t right() const { return words[1] & kLow24; }
    Merge merge() const {
      uint32_t id = words[0] >> 24 | (words[1] >> 24) << 8 | (words[2] >> 24) << 16;
      return {words[2] & kLow24, int32_t(id)};
    }
  };
  // Slot of the pair: the one holding it, or the empty one where it would go.
  size_t slot(uint32_t left, uint32_t right) const;

  std::vector<Slot> slots_ = std::vector<Slot>(1, Slot::none());
  size_t size_ = 0;
};

class BpeModel {
 public:
  explicit BpeModel(const Node& model);

  // Appends the ids of one word.
  void tokenize(std::string_view word, std::vector<int>& out) const;

  std::optional<int> token_to_id(std::string_view token) const;
  // nullopt for ids the vocab does not contain.
  std::optional<std::string_view> id_to_token(int id) const { return vocab_.token(id); }
  size_t vocab_size() const { return vocab_.size(); }
  size_t id_limit() const { return vocab_.id_limit(); }  // largest vocab id + 1
  // Heap held by the vocab and merge tables (the word cache aside).
  size_t bytes() const { return vocab_.bytes() + merges_.bytes(); }

 private:
  void merge_word(std::string_view word, std::vector<int>& out) const;
  int unk_id() const;

  std::string file_;
  VocabTable vocab_;
  MergeTable merges_;
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
