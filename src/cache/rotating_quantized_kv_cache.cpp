#include "cache/rotating_quantized_kv_cache.h"

#include "core/error.h"

namespace lmx {

namespace {
constexpr const char* kWhere = "RotatingQuantizedKVCache";
}  // namespace

RotatingQuantizedKVCache::RotatingQuantizedKVCache(int max_size, int keep, int group_size, int bits)
    : RotatingCacheBase(max_size, keep, kWhere), group_size_(group_size), bits_(bits) {
  QuantizedKVCache::validate(group_size, bits);
}

std::pair<mx::array, mx::array> RotatingQuantizedKVCache::update_and_fetch(const mx::array&,
                                                                           const mx::array&) {
  fail(kWhere, "keys and values are stored quantized, expected update_and_fetch_quantized");
}

std::pair<QuantizedArray, QuantizedArray> RotatingQuantizedKVCache::update_and_fetch_quantized(
    const mx::array& keys, const mx::array& values) {
  const QuantizedArray k = quantize_kv(keys, group_size_, bits_);
  const QuantizedArray v = quantize_kv(values, group_size_, bits_);
  std::vector<mx::array> out =
      ring_update({k.packed, k.scales, k.biases, v.packed, v.scales, v.biases});
  return {{out[0], out[1], out[2]}, {out[3], out[4], out[5]}};
}

void RotatingQuantizedKVCache::set_state(std::optional<QuantizedArray> keys,
                                         std::optional<QuantizedArray> values, int offset, int idx,
                                         int rollback) {
  std::vector<mx::array> data;
  if (keys && values) {
    data = {keys->packed,   keys->scales,   keys->biases,
            values->packed, values->scales, values->biases};
  }
  set_ring(std::move(data), offset, idx, rollback);
}

}  // namespace lmx
