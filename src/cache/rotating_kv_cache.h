// mlx-lm's RotatingKVCache (models/cache.py): a bounded ring for sliding-window layers. The first
// `keep` rows are never evicted; single-token writes go into the ring in place (the buffer is
// returned in ring order once full), multi-token writes first restore temporal order and keep
// max_size - 1 old rows so every new query sees at least max_size keys (the mask cuts the window).
#pragma once

#include "cache/kv_cache.h"

namespace lmx {

// The ring mechanics, shared by the plain and the quantized rotating caches. K and V are stored
// as `parts` arrays of (B, n_kv_heads, S, *) (K parts first, then V parts: one array each for the
// plain cache, a quantized triple each for the quantized one); every row operation applies to
// all of them alike, so quantizing rows commutes with the ring (mx::quantize works per row).
class RotatingCacheBase : public KVCacheBase {
 public:
  static constexpr int kStep = 256;
  RotatingCacheBase(int max_size, int keep, const char* where);

  int offset() const override { return offset_; }
  // Only before the ring wraps: afterwards the trimmed rows are gone.
  bool is_trimmable() const override { return offset_ < max_size_; }
  // bypass = false: mlx-lm's trim (offset and ring index back by n, only valid before the wrap).
  // bypass = true: speculative rollback that physically drops the last n rows, valid past the
  // window because the last write was a multi-token one (buffer in temporal order); n must be
  // less than that write's length, and the state is then that of a cache whose last write held
  // only the first rows.
  int trim(int n, bool bypass = false) override;
  Mask make_mask(int n, std::optional<int> window = std::nullopt,
                 bool return_array = false) const override;
  std::vector<mx::array> state() const override;
  size_t nbytes() const override;
  int capacity() const override { return data_.empty() ? 0 : data_[0].shape(2); }

  int max_size() const { return max_size_; }
  int keep() const { return keep_; }
  int idx() const { return idx_; }  // the next write position in the ring
  // Rows of the last multi-token write still in the buffer (what trim(n, true) may drop).
  int rollback_rows() const { return rollback_; }
  // The whole state, restorable later on this cache: what a speculative draft rolls back to once
  // single-token writes have wrapped the ring (trim cannot undo those). The arrays are immutable,
  // so this copies no data.
  struct Snapshot {
    std::vector<mx::array> data;
    int offset = 0, idx = 0, rollback = 0;
  };
  Snapshot snapshot() const { return {data_, offset_, idx_, rollback_}; }
  void restore(Snapshot s) { set_ring(std::move(s.data), s.offset, s.idx, s.rollback); }

  // For a writer that writes a step's L rows itself (the fused CPU layer, kernels/cpu/fused.h):
  // the parts as ring_update arranges them for L rows (grown, trimmed, rotated, or in temporal
  // order with L rows appended), the rows [pos, pos + L) to write, and the rows attention then
  // reads: [0, rows), the new rows last when L > 1, in ring order when L == 1. in_place: no array
  // of these parts has left the cache (state(), update_and_fetch's views), so the writer may
  // write them where they lie; otherwise it must write a copy. The parts are the writer's until
  // ring_commit stores them: the cache then holds what ring_update would have left.
  struct RingSlots {
    std::vector<mx::array> parts;
    int pos, rows;
    bool in_place;
  };
  // tails: each part's last dimension and dtype for an empty ring (a ring that holds rows keeps
  // theirs).
  RingSlots ring_reserve(int B, int H, int L, std::vector<std::pair<int, mx::Dtype>> tails);
  void ring_commit(std::vector<mx::array> parts, int L);

 protected:
  // Writes rows (the same parts layout as stored) and returns the active parts.
  std::vector<mx::array> ring_update(const std::vector<mx::array>& rows);
  // The state as stored (empty before the first write) and the ring position.
  void set_ring(std::vector<mx::array> data, int offset, int idx, int rollback = 0);
  const std::vector<mx::array>& data() const { return data_; }

 private:
  std::vector<mx::array> update_in_place(const std::vector<mx::array>& rows);
  // update_in_place before its write: grows, trims a multi-token write's extra rows, rotates.
  void make_room(int B, int H, const std::vector<std::pair<int, mx::Dtype>>& tails);
  std::vector<mx::array> update_concat(const std::vector<mx::array>& rows);
  mx::array trim_rows(int trim_size, const mx::array& v,
                      const std::optional<mx::array>& append = std::nullopt) const;
  mx::array temporal_order(const mx::array& v) const;
  std::vector<mx::array> active() const;

  const char* where_;
  int keep_, max_size_;
  std::vector<mx::array> data_;
  int offset_ = 0;
  int idx_ = 0;
  int rollback_ = 0;
  mutable bool shared_ = true;  // an array of data_ may be held outside the cache
};

class RotatingKVCache : public RotatingCacheBase {
 public:
  explicit RotatingKVCache(int max_size, int keep = 0);

  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                   const mx::array& values) override;
  // A RotatingQuantizedKVCache holding the same rows quantized (mlx-lm raises
  // NotImplementedError here; mlx-bun and mlx-optiq convert).
  std::unique_ptr<KVCacheBase> to_quantized(int group_size, int bits) const override;
  // mlx-lm's state setter (load_prompt_cache): buffers as stored (unset when empty).
  void set_state(std::optional<mx::array> keys, std::optional<mx::array> values, int offset,
                 int idx);
};

}  // namespace lmx
