// Layer and cache behaviour that the parity tests do not isolate.
#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "core/error.h"
#include "models/model.h"
#include "nn/layers.h"

namespace lmx {
namespace {

TEST(KVCache, GrowsInStepsAndTrims) {
  KVCache c;
  EXPECT_EQ(c.offset(), 0);
  EXPECT_TRUE(c.is_trimmable());
  auto kv = [](int L, float v) {
    return std::pair{mx::full({1, 2, L, 8}, v, mx::float32),
                     mx::full({1, 2, L, 4}, v, mx::float32)};
  };
  auto [k0, v0] = kv(5, 1.0f);
  auto [keys, values] = c.update_and_fetch(k0, v0);
  EXPECT_EQ(keys.shape(), (mx::Shape{1, 2, 5, 8}));
  EXPECT_EQ(values.shape(), (mx::Shape{1, 2, 5, 4}));
  EXPECT_EQ(c.offset(), 5);
  // A 300-token write crosses the 256 step: the buffer grows, the earlier rows are kept.
  auto [k1, v1] = kv(300, 2.0f);
  std::tie(keys, values) = c.update_and_fetch(k1, v1);
  EXPECT_EQ(keys.shape(2), 305);
  EXPECT_EQ(mx::sum(mx::slice(keys, {0, 0, 0, 0}, {1, 2, 5, 8})).item<float>(), 1.0f * 2 * 5 * 8);
  EXPECT_EQ(mx::sum(mx::slice(keys, {0, 0, 5, 0}, {1, 2, 305, 8})).item<float>(),
            2.0f * 2 * 300 * 8);
  EXPECT_EQ(c.trim(10), 10);
  EXPECT_EQ(c.offset(), 295);
  EXPECT_EQ(c.trim(1000), 295);  // never below zero
  EXPECT_EQ(c.offset(), 0);
  auto [k2, v2] = kv(3, 3.0f);
  std::tie(keys, values) = c.update_and_fetch(k2, v2);
  EXPECT_EQ(keys.shape(2), 3);
  EXPECT_EQ(mx::max(keys).item<float>(), 3.0f);  // trimmed rows are overwritten
}

TEST(KVCache, MasksFollowMlxLm) {
  KVCache c;
  EXPECT_EQ(c.make_mask(1).none(), true);
  EXPECT_EQ(c.make_mask(4).mode, "causal");
  Mask m = c.make_mask(4, std::nullopt, /*return_array=*/true);
  ASSERT_TRUE(m.array.has_value());
  EXPECT_EQ(m.array->shape(), (mx::Shape{4, 4}));
  // Window 2 at offset 0: each query sees itself and one key before it.
  mx::array w = *c.make_mask(3, 2).array;
  std::vector<bool> want = {true, false, false, true, true, false, false, true, true};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(mx::take(mx::flatten(w), i).item<bool>(), want[i]) << i;
}

TEST(CausalMask, OffsetRows) {
  mx::array m = create_causal_mask(2, 3);
  EXPECT_EQ(m.shape(), (mx::Shape{2, 5}));
  // Row 0 is position 3: keys 0..3 visible, key 4 not.
  EXPECT_TRUE(mx::take(mx::flatten(m), 3).item<bool>());
  EXPECT_FALSE(mx::take(mx::flatten(m), 4).item<bool>());
  EXPECT_TRUE(mx::take(mx::flatten(m), 9).item<bool>());
}

struct AddConstant : nn::LinearAdapter {
  float c;
  explicit AddConstant(float v) : c(v) {}
  mx::array operator()(const mx::array& x, const mx::array& y) const override {
    return mx::add(y, mx::array(c));
  }
};

TEST(Linear, AdaptersApplyInOrderAfterTheBias) {
  nn::Linear l;
  l.weight = mx::eye(3);
  l.bias = mx::ones({3});
  mx::array x = mx::array({1.0f, 2.0f, 3.0f}, {1, 3});
  EXPECT_TRUE(mx::array_equal(l(x), mx::array({2.0f, 3.0f, 4.0f}, {1, 3})).item<bool>());
  l.adapters.push_back(std::make_shared<AddConstant>(10.0f));
  l.adapters.push_back(std::make_shared<AddConstant>(0.5f));
  EXPECT_TRUE(mx::array_equal(l(x), mx::array({12.5f, 13.5f, 14.5f}, {1, 3})).item<bool>());
}

TEST(HiddenTap, KeepsChosenLayersAndPositions) {
  mx::array h = mx::reshape(mx::arange(2 * 5 * 3, mx::float32), {2, 5, 3});
  HiddenTap all;
  all.layers = {1};
  all.on_layer(0, h);  // not chosen
  all.on_layer(1, h);
  all.on_final(h);  // final_norm off
  EXPECT_EQ(all.layer_states.size(), 1u);
  EXPECT_TRUE(mx::array_equal(all.layer_states.at(1), h).item<bool>());
  EXPECT_FALSE(all.final_state.has_value());

  HiddenTap last;
  last.final_norm = true;
  last.position = -1;
  last.on_final(h);
  ASSERT_TRUE(last.final_state.has_value());
  EXPECT_TRUE(mx::array_equal(*last.final_state, mx::slice(h, {0, 4, 0}, {2, 5, 3})).item<bool>());
  last.position = 1;
  last.on_final(h);  // each forward overwrites
  EXPECT_TRUE(mx::array_equal(*last.final_state, mx::slice(h, {0, 1, 0}, {2, 2, 3})).item<bool>());
  last.position = 5;
  EXPECT_THROW(last.on_final(h), Error);
}

}  // namespace
}  // namespace lmx
