// A RotatingKVCache whose rows are stored as mx::quantize triples (mlx-optiq's and mlx-bun's
// RotatingQuantizedKVCache; mlx-lm has none): the ring of rotating_kv_cache.h over packed, scales
// and biases, every write quantized on arrival. Groups run along head_dim, so each row's triple
// is that of the row alone and the returned triples equal mx::quantize of what a RotatingKVCache
// fed the same writes returns.
#pragma once

#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"

namespace lmx {

class RotatingQuantizedKVCache : public RotatingCacheBase {
 public:
  RotatingQuantizedKVCache(int max_size, int keep = 0, int group_size = 64, int bits = 8);

  // Not available: the stored data is quantized (attention uses update_and_fetch_quantized).
  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                   const mx::array& values) override;
  std::pair<QuantizedArray, QuantizedArray> update_and_fetch_quantized(
      const mx::array& keys, const mx::array& values) override;
  std::optional<KVQuantization> quantization() const override {
    return KVQuantization{group_size_, bits_};
  }
  int group_size() const { return group_size_; }
  int bits() const { return bits_; }

  // RotatingKVCache::to_quantized's hand-over and load_prompt_cache: the stored triples (unset
  // before the first write), offset, ring index and the rows a bypass trim may drop.
  void set_state(std::optional<QuantizedArray> keys, std::optional<QuantizedArray> values,
                 int offset, int idx, int rollback = 0);

 private:
  int group_size_, bits_;
};

}  // namespace lmx
