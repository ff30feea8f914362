// KV caches with mlx-lm's semantics (models/cache.py): step growth, offset, trim.
#pragma once

#include <mlx/mlx.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lmx {

namespace mx = mlx::core;

// An attention mask as mlx-lm passes it: none, the string "causal", or an explicit array.
struct Mask {
  std::string mode;  // "" or "causal"
  std::optional<mx::array> array;
  // A batch of independent rows (RowsKVCache): each row's own mask, mode and array unused.
  std::vector<Mask> rows = {};
  bool none() const { return mode.empty() && !array && rows.empty(); }
};

// create_causal_mask(N, offset, window): bool (N, offset + N), true = attend.
mx::array create_causal_mask(int n, int offset, std::optional<int> window = std::nullopt);
// mlx-lm cache.create_attention_mask(N, offset, return_array, window_size), the make_mask of
// KVCache and QuantizedKVCache.
Mask create_attention_mask(int n, int offset, bool return_array, std::optional<int> window);

// One quantized K or V tensor as mx::quantize returns it: packed uint32
// (B, n_kv_heads, S, D * bits / 32), scales and biases (B, n_kv_heads, S, D / group_size) in the
// activation dtype.
struct QuantizedArray {
  mx::array packed, scales, biases;
};

struct KVQuantization {
  int group_size = 64;
  int bits = 8;
};

class KVCacheBase {
 public:
  virtual ~KVCacheBase() = default;
  // keys, values: (B, n_kv_heads, L, head_dim); returns everything cached so far.
  virtual std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                           const mx::array& values) = 0;
  virtual int offset() const = 0;
  virtual bool is_trimmable() const = 0;
  // Drops the last n tokens, returns how many. bypass: speculative rollback right after a
  // multi-token write, which rotating caches honour past the window (plain caches need nothing
  // more than the offset).
  virtual int trim(int n, bool bypass = false) = 0;
  virtual Mask make_mask(int n, std::optional<int> window = std::nullopt,
                         bool return_array = false) const = 0;
  // The arrays to evaluate after a prefill chunk (mlx-lm's `cache.state`).
  virtual std::vector<mx::array> state() const = 0;
  virtual size_t nbytes() const = 0;
  // Sequence slots allocated; nbytes() / capacity() is what one more cached token costs.
  virtual int capacity() const { return 0; }
  // mlx-lm's `hasattr(cache, "bits")`: set when K/V are stored quantized. Attention then calls
  // update_and_fetch_quantized and mlx-lm's quantized_scaled_dot_product_attention.
  virtual std::optional<KVQuantization> quantization() const { return std::nullopt; }
  virtual std::pair<QuantizedArray, QuantizedArray> update_and_fetch_quantized(
      const mx::array& keys, const mx::array& values);
  // mlx-lm's `to_quantized(group_size, bits)`; nullptr for cache types without one (which
  // maybe_quantize_kv_cache leaves alone). May throw where mlx-lm raises.
  virtual std::unique_ptr<KVCacheBase> to_quantized(int group_size, int bits) const {
    return nullptr;
  }
};

class KVCache : public KVCacheBase {
 public:
  static constexpr int kStep = 256;
  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                   const mx::array& values) override;
  int offset() const override { return offset_; }
  bool is_trimmable() const override { return true; }
  int trim(int n, bool bypass = false) override;
  Mask make_mask(int n, std::optional<int> window = std::nullopt,
                 bool return_array = false) const override;
  std::vector<mx::array> state() const override;
  size_t nbytes() const override;
  int capacity() const override { return keys_ ? keys_->shape(2) : 0; }
  // The whole buffer (padding rows included) quantized, as mlx-lm does.
  std::unique_ptr<KVCacheBase> to_quantized(int group_size, int bits) const override;
  // mlx-lm's state setter (load_prompt_cache): whole buffers (unset when empty) and offset.
  void set_state(std::optional<mx::array> keys, std::optional<mx::array> values, int offset);

  // The whole buffers (B, H, capacity, D), grown as update_and_fetch grows them to hold L more
  // rows, for a caller that writes rows [offset(), offset() + L) itself (the fused CPU layer)
  // and then hands the written buffers to commit. in_place: no array of these buffers has left
  // the cache (state(), update_and_fetch's views, set_state), so the writer may write them
  // where they lie; otherwise it must write a copy.
  struct Buffers {
    mx::array keys, values;
    bool in_place;
  };
  Buffers reserve(int B, int H, int Dk, int Dv, mx::Dtype dtype, int L);
  void commit(mx::array keys, mx::array values, int L);

 private:
  void grow(int B, int H, int Dk, int Dv, mx::Dtype dtype, int L);
  std::optional<mx::array> keys_, values_;
  int offset_ = 0;
  mutable bool shared_ = false;  // an array of the current buffers is held outside the cache
};

using Cache = std::vector<std::unique_ptr<KVCacheBase>>;

// Helpers on the sequence axis (2) of (B, heads, S, D) arrays: v[..., start:stop, :] and
// v[..., start:start + rows, :] = rows.
mx::array seq_slice(const mx::array& v, int start, int stop);
mx::array seq_assign(const mx::array& v, const mx::array& rows, int start);

}  // namespace lmx
