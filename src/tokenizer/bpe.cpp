#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <utility>

#include "tokenizer/unicode.h"

namespace lmx::tok {

namespace {

// Slots for n entries at a load factor of at most 0.7.
size_t table_size(size_t n) { return n + n * 3 / 7 + 1; }
bool over_load(size_t entries, size_t slots) { return entries * 10 > slots * 7; }

// Maps a hash onto [0, n) by its high 32 bits (multiply-shift), so that tables need not be sized
// to a power of two; n stays far below 2^32.
size_t reduce(uint64_t hash, size_t n) { return size_t(((hash >> 32) * uint64_t(n)) >> 32); }

// MurmurHash3's finalizer: every key bit reaches the high bits that reduce() uses.
uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

void VocabTable::reserve(size_t keys, size_t bytes) {
  blob_.reserve(bytes);
  begins_.reserve(keys + 1);
  ids_.reserve(keys);
  slots_.assign(table_size(keys), kNone);
  for (uint32_t k = 0; k < ids_.size(); ++k) slots_[slot(key(k))] = k;
}

size_t VocabTable::slot(std::string_view token) const {
  size_t n = slots_.size();
  size_t i = reduce(std::hash<std::string_view>{}(token), n);
  while (slots_[i] != kNone && key(slots_[i]) != token) {
    if (++i == n) i = 0;
  }
  return i;
}

void VocabTable::add(std::string_view token, int id) {
  if (over_load(ids_.size() + 1, slots_.size())) reserve(2 * ids_.size() + 1, blob_.size());
  size_t s = slot(token);
  if (slots_[s] != kNone) {
    ids_[slots_[s]] = id;
    return;
  }
  slots_[s] = uint32_t(ids_.size());
  blob_.append(token);
  begins_.push_back(uint32_t(blob_.size()));
  ids_.push_back(id);
}

void VocabTable::index_ids() {
  int max_id = -1;
  for (int id : ids_) max_id = std::max(max_id, id);
  by_id_.assign(size_t(max_id) + 1, kNone);
  for (uint32_t k = 0; k < ids_.size(); ++k) {
    if (by_id_[size_t(ids_[k])] == kNone) by_id_[size_t(ids_[k])] = k;
  }
}

int VocabTable::find(std::string_view token) const {
  uint32_t k = slots_[slot(token)];
  return k == kNone ? -1 : ids_[k];
}

std::optional<std::string_view> VocabTable::token(int id) const {
  if (id < 0 || size_t(id) >= by_id_.size() || by_id_[size_t(id)] == kNone) return std::nullopt;
  return key(by_id_[size_t(id)]);
}

size_t VocabTable::bytes() const {
  return blob_.capacity() + sizeof(uint32_t) * (begins_.capacity() + ids_.capacity() +
                                                by_id_.capacity() + slots_.capacity());
}

static_assert(kMaxTokenId <= (int64_t{1} << 24) - 1, "MergeTable packs ids into 24 bits");

void MergeTable::reserve(size_t n) {
  std::vector<Slot> old = std::exchange(slots_, std::vector<Slot>(table_size(n), Slot::none()));
  for (const Slot& s : old) {
    if (!s.empty()) slots_[slot(s.left(), s.right())] = s;
  }
}

size_t MergeTable::slot(uint32_t left, uint32_t right) const {
  size_t n = slots_.size();
  size_t i = reduce(mix(uint64_t(left) << 32 | right), n);
  while (!slots_[i].empty() && (slots_[i].left() != left || slots_[i].right() != right)) {
    if (++i == n) i = 0;
  }
  return i;
}

void MergeTable::assign(int left, int right, Merge merge) {
  if (over_load(size_ + 1, slots_.size())) reserve(2 * size_ + 1);
  Slot& s = slots_[slot(uint32_t(left), uint32_t(right))];
  if (s.empty()) ++size_;
  s = Slot::pack(uint32_t(left), uint32_t(right), merge);
}

BpeModel::BpeModel(const Node& model) : file_(model.file()) {
  // dropout is ignored on purpose: encoding stays deterministic.
  unk_token_ = model.opt_str("unk_token");
  continuing_subword_prefix_ = model.str("continuing_subword_prefix", "");
  end_of_word_suffix_ = model.str("end_of_word_suffix", "");
  fuse_unk_ = model.boolean("fuse_unk", false);
  byte_fallback_ = model.boolean("byte_fallback", false);
  ignore_merges_ = model.boolean("ignore_merges", false);

  Node vocab = model.at("vocab");
  if (!vocab.raw().is_object())
    vocab.fail("expected an object {token: id}, got ", Node::kind(vocab.raw()));
  size_t bytes = 0;
  for (auto it = vocab.raw().begin(); it != vocab.raw().end(); ++it) bytes += it.key().size();
  // The tables address the blob with 32-bit offsets.
  if (bytes >= UINT32_MAX) vocab.fail("expected under 4 GiB of token strings, got ", bytes);
  vocab_.reserve(vocab.raw().size(), bytes);
  for (const auto& [token, id_json] : vocab.raw().items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > kMaxTokenId) {
      vocab.fail("expected an integer id in [0, ", kMaxTokenId, "] for \"", token, "\", got ",
                 id_json.dump());
    }
    vocab_.add(token, int(id_json.get<int64_t>()));
  }
  vocab_.index_ids();

  Node merges = model.at("merges");
  size_t n = merges.size();
  if (n > MergeTable::kMaxMerges) {
    merges.fail("expected at most ", MergeTable::kMaxMerges, " merges, got ", n);
  }
  merges_.reserve(n);
  size_t prefix_len = continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < n; ++rank) {
    Node m = merges[rank];
    std::string left, right;
    if (m.raw().is_string()) {
      std::string s = m.as_string();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        m.fail("expected \"left right\" (exactly one space), got \"", s, "\"");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.raw().is_array() && m.raw().size() == 2 && m.raw()[0].is_string() &&
               m.raw()[1].is_string()) {
      left = m.raw()[0].get<std::string>();
      right = m.raw()[1].get<std::string>();
    } else {
      m.fail("expected \"left right\" or [left, right], got ", m.raw().dump());
    }
    int a = vocab_.find(left), b = vocab_.find(right);
    if (a < 0) m.fail("token \"", left, "\" is not in model.vocab");
    if (b < 0) m.fail("token \"", right, "\" is not in model.vocab");
    std::string merged = left;
    if (prefix_len > 0 && right.compare(0, prefix_len, continuing_subword_prefix_) == 0) {
      merged.append(right, prefix_len, std::string::npos);
    } else {
      merged.append(right);
    }
    int c = vocab_.find(merged);
    if (c < 0) m.fail("merged token \"", merged, "\" is not in model.vocab");
    // A repeated pair keeps its last rank, as in `tokenizers`.
    merges_.assign(a, b, {uint32_t(rank), c});
  }

  byte_ids_.fill(-1);
  if (byte_fallback_) {
    for (int byte = 0; byte < 256; ++byte) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", byte);
      byte_ids_[byte] = vocab_.find(name);
    }
  }
}

std::optional<int> BpeModel::token_to_id(std::string_view token) const {
  int id = vocab_.find(token);
  if (id < 0) return std::nullopt;
  return id;
}

int BpeModel::unk_id() const {
  int id = vocab_.find(*unk_token_);
  if (id < 0) {
    fail(file_, "model.unk_token: needed for a character outside the vocab, expected a token of ",
         "model.vocab, got \"", *unk_token_, "\"");
  }
  return id;
}

void BpeModel::tokenize(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (int id = vocab_.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  bool cacheable = word.size() < kMaxCachedWord;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) {
      cache_.try_emplace(std::string(word), out.begin() + std::ptrdiff_t(first), out.end());
    }
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int>& out) const {
  struct Symbol {
    int id;
    int prev;
    int next;
    bool alive;
  };
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  auto add = [&](int id) {
    int index = int(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  };

  // Initial symbols: one per character, with byte fallback and unknown handling mirroring
  // `tokenizers` (a pending unknown is only flushed by the next in-vocab character).
  int pending_unk = -1;
  std::string piece;
  size_t i = 0;
  while (i < word.size()) {
    size_t start = i;
    i += utf8_seq_len(static_cast<unsigned char>(word[i]));
    std::string_view ch = word.substr(start, i - start);
    std::string_view key = ch;
    if ((start > 0 && !continuing_subword_prefix_.empty()) ||
        (i == word.size() && !end_of_word_suffix_.empty())) {
      piece.clear();
      if (start > 0) piece.append(continuing_subword_prefix_);
      piece.append(ch);
      if (i == word.size()) piece.append(end_of_word_suffix_);
      key = piece;
    }
    if (int id = vocab_.find(key); id >= 0) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = std::all_of(key.begin(), key.end(),
                             [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; });
      if (all) {
        for (char c : key) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_token_) {
      int unk = unk_id();
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk;
    }
  }
  if (pending_unk >= 0) add(pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    uint32_t rank;
    int pos;
    int new_id;
  };
  // Min-heap on (rank, pos): lowest rank first, leftmost among equal ranks.
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<Candidate> heap;
  heap.clear();
  auto push_pair = [&](int pos) {
    int next = symbols[size_t(pos)].next;
    if (next < 0) return;
    std::optional<MergeTable::Merge> m =
        merges_.find(symbols[size_t(pos)].id, symbols[size_t(next)].id);
    if (!m) return;
    heap.push_back({m->rank, pos, m->new_id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int p = 0; p + 1 < int(symbols.size()); ++p) push_pair(p);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[size_t(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[size_t(left.next)];
    // Entries go stale when a neighbour merged first; the pair's current result tells.
    std::optional<MergeTable::Merge> m = merges_.find(left.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace lmx::tok
