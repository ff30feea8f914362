// mlx-lm's RotatingKVCache (models/cache.py): a bounded ring for sliding-window layers. The first
// `keep` rows are never evicted; single-token writes go into the ring in place (the buffer is
// returned in ring order once full), multi-token writes first restore temporal order and keep
// max_size - 1 old rows so every new query sees at least max_size keys (the mask cuts the window).
#pragma once

#include "cache/kv_cache.h"

namespace lmx {

class RotatingKVCache : public KVCacheBase {
 public:
  static constexpr int kStep = 256;
  explicit RotatingKVCache(int max_size, int keep = 0);

  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                   const mx::array& values) override;
  int offset() const override { return offset_; }
  // Only before the ring wraps: afterwards the trimmed rows are gone.
  bool is_trimmable() const override { return offset_ < max_size_; }
  int trim(int n) override;
  Mask make_mask(int n, std::optional<int> window = std::nullopt,
                 bool return_array = false) const override;
  std::vector<mx::array> state() const override;
  size_t nbytes() const override;
  int capacity() const override { return keys_ ? keys_->shape(2) : 0; }
  // mlx-lm raises NotImplementedError ("RotatingKVCache Quantization NYI"); so does this.
  std::unique_ptr<KVCacheBase> to_quantized(int group_size, int bits) const override;

  int max_size() const { return max_size_; }
  int keep() const { return keep_; }
  int idx() const { return idx_; }  // the next write position in the ring
  // mlx-lm's state setter (load_prompt_cache): buffers as stored (unset when empty).
  void set_state(std::optional<mx::array> keys, std::optional<mx::array> values, int offset,
                 int idx);

 private:
  std::pair<mx::array, mx::array> update_in_place(const mx::array& keys, const mx::array& values);
  std::pair<mx::array, mx::array> update_concat(const mx::array& keys, const mx::array& values);
  mx::array trim_rows(int trim_size, const mx::array& v,
                      const std::optional<mx::array>& append = std::nullopt) const;
  mx::array temporal_order(const mx::array& v) const;
  std::pair<mx::array, mx::array> keys_and_values() const;

  int keep_, max_size_;
  std::optional<mx::array> keys_, values_;
  int offset_ = 0;
  int idx_ = 0;
};

}  // namespace lmx
