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
  bool none() const { return mode.empty() && !array; }
};

// create_causal_mask(N, offset, window): bool (N, offset + N), true = attend.
mx::array create_causal_mask(int n, int offset, std::optional<int> window = std::nullopt);

class KVCacheBase {
 public:
  virtual ~KVCacheBase() = default;
  // keys, values: (B, n_kv_heads, L, head_dim); returns everything cached so far.
  virtual std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                           const mx::array& values) = 0;
  virtual int offset() const = 0;
  virtual bool is_trimmable() const = 0;
  virtual int trim(int n) = 0;
  virtual Mask make_mask(int n, std::optional<int> window = std::nullopt,
                         bool return_array = false) const = 0;
  // The arrays to evaluate after a prefill chunk (mlx-lm's `cache.state`).
  virtual std::vector<mx::array> state() const = 0;
  virtual size_t nbytes() const = 0;
};

class KVCache : public KVCacheBase {
 public:
  static constexpr int kStep = 256;
  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                   const mx::array& values) override;
  int offset() const override { return offset_; }
  bool is_trimmable() const override { return true; }
  int trim(int n) override;
  Mask make_mask(int n, std::optional<int> window = std::nullopt,
                 bool return_array = false) const override;
  std::vector<mx::array> state() const override;
  size_t nbytes() const override;

 private:
  std::optional<mx::array> keys_, values_;
  int offset_ = 0;
};

using Cache = std::vector<std::unique_ptr<KVCacheBase>>;

}  // namespace lmx
