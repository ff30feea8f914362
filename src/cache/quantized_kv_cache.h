// mlx-lm's QuantizedKVCache (models/cache.py): K/V stored as mx::quantize triples (affine, groups
// along head_dim), grown in steps of 256 rows, every update quantized on write.
#pragma once

#include "cache/kv_cache.h"

namespace lmx {

// mx::quantize(x, group_size, bits) as a triple; x (..., D) with D % group_size == 0.
QuantizedArray quantize_kv(const mx::array& x, int group_size, int bits);

class QuantizedKVCache : public KVCacheBase {
 public:
  static constexpr int kStep = 256;
  QuantizedKVCache(int group_size = 64, int bits = 8);
  // Throws unless mx::quantize supports the pair (bits 2-6 or 8, group size 32, 64 or 128).
  static void validate(int group_size, int bits);

  // Not available: the stored data is quantized (attention uses update_and_fetch_quantized).
  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                   const mx::array& values) override;
  std::pair<QuantizedArray, QuantizedArray> update_and_fetch_quantized(
      const mx::array& keys, const mx::array& values) override;
  int offset() const override { return offset_; }
  bool is_trimmable() const override { return true; }
  int trim(int n, bool bypass = false) override;
  Mask make_mask(int n, std::optional<int> window = std::nullopt,
                 bool return_array = false) const override;
  std::vector<mx::array> state() const override;
  size_t nbytes() const override;
  int capacity() const override { return keys_ ? keys_->packed.shape(2) : 0; }
  std::optional<KVQuantization> quantization() const override {
    return KVQuantization{group_size_, bits_};
  }

  // KVCache::to_quantized's hand-over and load_prompt_cache: whole buffers (unset before the
  // first write) and offset.
  void set_state(std::optional<QuantizedArray> keys, std::optional<QuantizedArray> values,
                 int offset);
  int group_size() const { return group_size_; }
  int bits() const { return bits_; }

 private:
  std::optional<QuantizedArray> keys_, values_;
  int offset_ = 0;
  int group_size_, bits_;
};

}  // namespace lmx
