// KV caches against mlx-lm's cache objects (scripts/gen_cache_fixtures.py): every recorded
// operation replayed on lmx's cache, returned keys/values (or quantized triples), masks, offsets
// and ring positions identical.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cache/arrays_cache.h"
#include "cache/prompt_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "cache/rotating_quantized_kv_cache.h"
#include "core/error.h"
#include "generate/generate.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace lmx {
namespace {

using nlohmann::json;

struct Fixtures {
  Weights arrays;
  json meta;
  Fixtures() {
    arrays = load_safetensors(test::data_path("caches/caches.safetensors"));
    std::ifstream in(test::data_path("caches/caches.json"));
    meta = json::parse(in);
  }
  const mx::array& at(const std::string& k) const {
    auto it = arrays.find(k);
    if (it == arrays.end()) throw std::runtime_error("fixture array '" + k + "' is missing");
    return it->second;
  }
};

::testing::AssertionResult identical(const mx::array& got, const mx::array& want) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(got.shape()) << ", expected " << shape_str(want.shape());
  if (got.dtype() != want.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(got.dtype()) << ", expected " << dtype_name(want.dtype());
  if (!mx::array_equal(got, want).item<bool>())
    return ::testing::AssertionFailure() << "values differ";
  return ::testing::AssertionSuccess();
}

std::unique_ptr<KVCacheBase> make_cache(const json& spec) {
  const std::string type = spec.at("type");
  if (type == "KVCache") return std::make_unique<KVCache>();
  if (type == "RotatingKVCache")
    return std::make_unique<RotatingKVCache>(spec.at("max_size").get<int>(),
                                             spec.at("keep").get<int>());
  if (type == "RotatingQuantizedKVCache")
    return std::make_unique<RotatingQuantizedKVCache>(
        spec.at("max_size").get<int>(), spec.at("keep").get<int>(),
        spec.at("group_size").get<int>(), spec.at("bits").get<int>());
  if (type == "QuantizedKVCache")
    return std::make_unique<QuantizedKVCache>(spec.at("group_size").get<int>(),
                                              spec.at("bits").get<int>());
  throw std::runtime_error("unknown cache type " + type);
}

void expect_state(const KVCacheBase& c, const json& after, const std::string& where) {
  EXPECT_EQ(c.offset(), after.at("offset").get<int>()) << where << ": offset";
  if (after.contains("idx")) {
    const auto* r = dynamic_cast<const RotatingCacheBase*>(&c);
    ASSERT_NE(r, nullptr) << where;
    EXPECT_EQ(r->idx(), after.at("idx").get<int>()) << where << ": ring index";
  }
}

// Replays one scenario; returns the number of compared arrays.
int replay(const Fixtures& f, const json& scenario) {
  const std::string name = scenario.at("name");
  std::unique_ptr<KVCacheBase> cache = make_cache(scenario.at("cache"));
  int compared = 0;
  int i = 0;
  for (const json& op : scenario.at("ops")) {
    const std::string kind = op.at("op");
    std::string where = name;
    where.append(" op ").append(std::to_string(i++)).append(" (").append(kind).append(")");
    if (kind == "update") {
      const std::string in = op.at("inputs");
      const mx::array& k = f.at(in + ".keys");
      const mx::array& v = f.at(in + ".values");
      if (cache->quantization()) {
        auto [qk, qv] = cache->update_and_fetch_quantized(k, v);
        if (op.at("record").get<bool>()) {
          const std::string out = op.at("outputs");
          const mx::array* got[] = {&qk.packed, &qk.scales, &qk.biases,
                                    &qv.packed, &qv.scales, &qv.biases};
          for (int j = 0; j < 6; ++j) {
            const std::string key = out + (j < 3 ? ".keys." : ".values.") + std::to_string(j % 3);
            EXPECT_TRUE(identical(*got[j], f.at(key))) << where << ": " << key;
            ++compared;
          }
        }
      } else {
        auto [keys, values] = cache->update_and_fetch(k, v);
        if (op.at("record").get<bool>()) {
          const std::string out = op.at("outputs");
          EXPECT_TRUE(identical(keys, f.at(out + ".keys"))) << where << ": keys";
          EXPECT_TRUE(identical(values, f.at(out + ".values"))) << where << ": values";
          compared += 2;
        }
      }
      expect_state(*cache, op.at("after"), where);
    } else if (kind == "mask") {
      std::optional<int> window;
      if (!op.at("window").is_null()) window = op.at("window").get<int>();
      const Mask m = cache->make_mask(op.at("length").get<int>(), window);
      const json& want = op.at("mask");
      if (want.is_null()) {
        EXPECT_TRUE(m.none()) << where << ": expected no mask";
      } else if (want == "causal") {
        EXPECT_TRUE(m.mode == "causal" && !m.array) << where << ": expected \"causal\"";
      } else {
        if (!m.array) {
          ADD_FAILURE() << where << ": expected an array mask";
          continue;
        }
        EXPECT_TRUE(identical(*m.array, f.at(op.at("array")))) << where;
        ++compared;
      }
    } else if (kind == "is_trimmable") {
      EXPECT_EQ(cache->is_trimmable(), op.at("result").get<bool>()) << where;
    } else if (kind == "trim") {
      EXPECT_EQ(cache->trim(op.at("n").get<int>()), op.at("result").get<int>()) << where;
      expect_state(*cache, op.at("after"), where);
    } else if (kind == "rollback") {
      // lmx gets all `length` tokens and drops the last n; mlx-lm's cache got only the rest.
      const std::string in = op.at("inputs");
      const mx::array& k = f.at(in + ".keys");
      const mx::array& v = f.at(in + ".values");
      if (cache->quantization()) {
        cache->update_and_fetch_quantized(k, v);
      } else {
        cache->update_and_fetch(k, v);
      }
      const int n = op.at("n").get<int>();
      EXPECT_EQ(cache->trim(n, /*bypass=*/true), n) << where;
      const std::vector<mx::array> state = cache->state();
      const int parts = op.at("parts").get<int>();
      EXPECT_EQ(static_cast<int>(state.size()), parts) << where;
      for (int j = 0; j < parts && j < static_cast<int>(state.size()); ++j) {
        const std::string key = op.at("state").get<std::string>() + "." + std::to_string(j);
        EXPECT_TRUE(identical(state[j], f.at(key))) << where << ": " << key;
        ++compared;
      }
      expect_state(*cache, op.at("after"), where);
    } else if (kind == "to_quantized") {
      auto q = cache->to_quantized(op.at("group_size").get<int>(), op.at("bits").get<int>());
      EXPECT_NE(q, nullptr) << where;
      if (!q) return compared;
      cache = std::move(q);
      expect_state(*cache, op.at("after"), where);
    } else {
      ADD_FAILURE() << where << ": unknown operation";
    }
  }
  return compared;
}

TEST(CacheFixtures, EveryOperationMatchesMlxLm) {
  Fixtures f;
  std::set<std::string> types;
  int scenarios = 0, compared = 0;
  for (const json& s : f.meta.at("scenarios")) {
    SCOPED_TRACE(s.at("name").get<std::string>());
    types.insert(s.at("cache").at("type").get<std::string>());
    compared += replay(f, s);
    ++scenarios;
  }
  EXPECT_GE(scenarios, 10);
  EXPECT_EQ(types, (std::set<std::string>{"KVCache", "QuantizedKVCache", "RotatingKVCache",
                                          "RotatingQuantizedKVCache"}));
  EXPECT_GT(compared, 1000);
}

// One more write on every cache loaded from mlx-lm's prompt-cache file: outputs and state as
// mlx-lm's loaded caches gave them.
void continue_like_mlx_lm(const Fixtures& f, Cache& cache, const json& steps) {
  ASSERT_EQ(cache.size(), steps.size());
  for (size_t i = 0; i < cache.size(); ++i) {
    const json& step = steps[i];
    const std::string key = "prompt_cache." + std::to_string(i);
    const std::string where = key + " (" + step.at("cls").get<std::string>() + ")";
    const mx::array& k = f.at(key + ".in.keys");
    const mx::array& v = f.at(key + ".in.values");
    std::vector<mx::array> got;
    if (step.at("quantized").get<bool>()) {
      ASSERT_TRUE(cache[i]->quantization()) << where;
      auto [qk, qv] = cache[i]->update_and_fetch_quantized(k, v);
      got = {qk.packed, qk.scales, qk.biases, qv.packed, qv.scales, qv.biases};
    } else {
      auto [keys, values] = cache[i]->update_and_fetch(k, v);
      got = {keys, values};
    }
    const size_t per = got.size() / 2;
    for (size_t j = 0; j < got.size(); ++j) {
      const std::string name =
          key + ".out." + (j < per ? "keys." : "values.") + std::to_string(j % per);
      EXPECT_TRUE(identical(got[j], f.at(name))) << where << ": " << name;
    }
    expect_state(*cache[i], step.at("after"), where);
  }
}

TEST(PromptCache, LoadsMlxLmFilesAndContinuesIdentically) {
  Fixtures f;
  const json& pc = f.meta.at("prompt_cache");
  PromptCache loaded =
      load_prompt_cache(test::data_path("caches/" + pc.at("file").get<std::string>()));
  EXPECT_EQ(loaded.metadata, (pc.at("metadata").get<Metadata>()));
  ASSERT_EQ(loaded.cache.size(), 6u);
  EXPECT_NE(dynamic_cast<RotatingKVCache*>(loaded.cache[1].get()), nullptr);
  EXPECT_EQ(dynamic_cast<RotatingKVCache*>(loaded.cache[1].get())->keep(), 2);
  EXPECT_EQ(loaded.cache[3]->offset(), 0);  // saved empty
  continue_like_mlx_lm(f, loaded.cache, pc.at("steps"));
}

// Saving what was loaded writes mlx-lm's layout exactly: the same metadata entries and arrays.
TEST(PromptCache, SavesMlxLmLayout) {
  Fixtures f;
  const json& pc = f.meta.at("prompt_cache");
  const auto theirs = test::data_path("caches/" + pc.at("file").get<std::string>());
  PromptCache loaded = load_prompt_cache(theirs);
  const auto ours = std::filesystem::temp_directory_path() /
                    ("lmx_prompt_cache_" + std::to_string(::getpid()) + ".safetensors");
  save_prompt_cache(ours, loaded.cache, loaded.metadata);
  Metadata their_meta, our_meta;
  Weights their_arrays = load_safetensors(theirs, &their_meta);
  Weights our_arrays = load_safetensors(ours, &our_meta);
  EXPECT_EQ(our_meta, their_meta);
  ASSERT_EQ(our_arrays.size(), their_arrays.size());
  for (const auto& [k, a] : their_arrays) {
    auto it = our_arrays.find(k);
    if (it == our_arrays.end()) {
      ADD_FAILURE() << "missing array " << k;
      continue;
    }
    EXPECT_TRUE(identical(it->second, a)) << k;
  }
  // And the round trip continues like mlx-lm too.
  PromptCache again = load_prompt_cache(ours);
  std::filesystem::remove(ours);
  continue_like_mlx_lm(f, again.cache, pc.at("steps"));
}

// A hybrid model's prompt cache written by mlx-lm: the linear-attention states load as
// ArraysCache with their arrays (an unset slot stays unset), take the token count of the KVCache
// beside them, and save back to mlx-lm's layout exactly.
TEST(PromptCache, LoadsAndSavesMlxLmArraysCaches) {
  Fixtures f;
  const json& pc = f.meta.at("arrays_prompt_cache");
  const auto theirs = test::data_path("caches/" + pc.at("file").get<std::string>());
  PromptCache loaded = load_prompt_cache(theirs);
  EXPECT_EQ(loaded.metadata, (pc.at("metadata").get<Metadata>()));
  ASSERT_EQ(loaded.cache.size(), 3u);
  auto* filled = dynamic_cast<ArraysCache*>(loaded.cache[0].get());
  auto* empty = dynamic_cast<ArraysCache*>(loaded.cache[1].get());
  ASSERT_NE(filled, nullptr);
  ASSERT_NE(empty, nullptr);
  Metadata their_meta;
  Weights their_arrays = load_safetensors(theirs, &their_meta);
  ASSERT_TRUE((*filled)[0] && (*filled)[1]);
  EXPECT_TRUE(identical(*(*filled)[0], their_arrays.at("0.0.0")));
  EXPECT_TRUE(identical(*(*filled)[1], their_arrays.at("0.0.1")));
  EXPECT_EQ((*filled)[1]->dtype(), mx::float32);
  EXPECT_FALSE((*empty)[0] || (*empty)[1]);
  EXPECT_EQ(filled->offset(), pc.at("offset").get<int>());
  EXPECT_EQ(empty->offset(), 0);
  EXPECT_EQ(loaded.cache[2]->offset(), pc.at("offset").get<int>());

  const auto ours = std::filesystem::temp_directory_path() /
                    ("lmx_prompt_cache_arrays_" + std::to_string(::getpid()) + ".safetensors");
  save_prompt_cache(ours, loaded.cache, loaded.metadata);
  Metadata our_meta;
  Weights our_arrays = load_safetensors(ours, &our_meta);
  std::filesystem::remove(ours);
  EXPECT_EQ(our_meta, their_meta);
  ASSERT_EQ(our_arrays.size(), their_arrays.size());
  for (const auto& [k, a] : their_arrays) {
    auto it = our_arrays.find(k);
    if (it == our_arrays.end()) {
      ADD_FAILURE() << "missing array " << k;
      continue;
    }
    EXPECT_TRUE(identical(it->second, a)) << k;
  }
}

// lmx's RotatingQuantizedKVCache (no mlx-lm counterpart) saves and loads in the same layout:
// the loaded ring holds the same triples and continues exactly like the saved one.
TEST(PromptCache, RoundTripsRotatingQuantizedCaches) {
  Cache cache;
  cache.push_back(std::make_unique<RotatingKVCache>(8, 1));
  cache.push_back(std::make_unique<RotatingQuantizedKVCache>(8, 0, 32, 4));
  for (int i = 0; i < 11; ++i)
    for (auto& c : cache) {
      mx::array k = mx::astype(mx::random::normal({1, 2, 1, 64}), mx::bfloat16);
      if (c->quantization()) {
        c->update_and_fetch_quantized(k, k);
      } else {
        c->update_and_fetch(k, k);
      }
    }
  cache[0] = cache[0]->to_quantized(64, 8);
  const auto file = std::filesystem::temp_directory_path() /
                    ("lmx_prompt_cache_rq_" + std::to_string(::getpid()) + ".safetensors");
  save_prompt_cache(file, cache, {{"k", "v"}});
  PromptCache loaded = load_prompt_cache(file);
  std::filesystem::remove(file);
  ASSERT_EQ(loaded.cache.size(), 2u);
  mx::array k = mx::astype(mx::random::normal({1, 2, 1, 64}), mx::bfloat16);
  for (size_t i = 0; i < 2; ++i) {
    auto* a = dynamic_cast<RotatingQuantizedKVCache*>(cache[i].get());
    auto* b = dynamic_cast<RotatingQuantizedKVCache*>(loaded.cache[i].get());
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->offset(), a->offset());
    EXPECT_EQ(b->idx(), a->idx());
    EXPECT_EQ(b->keep(), a->keep());
    EXPECT_EQ(b->max_size(), a->max_size());
    EXPECT_EQ(b->quantization()->bits, a->quantization()->bits);
    EXPECT_EQ(b->quantization()->group_size, a->quantization()->group_size);
    auto [ka, va] = a->update_and_fetch_quantized(k, k);
    auto [kb, vb] = b->update_and_fetch_quantized(k, k);
    for (auto [x, y] : {std::pair{&ka, &kb}, std::pair{&va, &vb}}) {
      EXPECT_TRUE(identical(y->packed, x->packed)) << i;
      EXPECT_TRUE(identical(y->scales, x->scales)) << i;
      EXPECT_TRUE(identical(y->biases, x->biases)) << i;
    }
  }
}

TEST(PromptCache, RejectsUnknownClasses) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("lmx_prompt_cache_bad_" + std::to_string(::getpid()) + ".safetensors");
  save_safetensors(path, {{"0.0", mx::array(1)}}, {{"1.0", "ArraysCache"}, {"2.0", ""}});
  EXPECT_THROW(load_prompt_cache(path), Error);
  std::filesystem::remove(path);
}

mx::array rows(int n, float v, int d = 64) { return mx::full({1, 2, n, d}, v, mx::bfloat16); }

TEST(RotatingKVCache, TrimmableOnlyBeforeTheRingWraps) {
  RotatingKVCache c(8);
  c.update_and_fetch(rows(6, 1), rows(6, 1));
  EXPECT_TRUE(c.is_trimmable());
  EXPECT_EQ(c.trim(2), 2);
  EXPECT_EQ(c.offset(), 4);
  EXPECT_EQ(c.idx(), 4);
  for (int i = 0; i < 4; ++i) c.update_and_fetch(rows(1, 2), rows(1, 2));
  EXPECT_FALSE(c.is_trimmable());  // offset 8 == max_size
  auto [k, v] = c.update_and_fetch(rows(1, 3), rows(1, 3));
  EXPECT_EQ(k.shape(2), 8);  // the whole ring, in ring order
  EXPECT_EQ(c.idx(), 1);
}

// Where mlx-lm raises NotImplementedError, the ring converts: same offset, ring index, window.
TEST(RotatingKVCache, QuantizesIntoARotatingQuantizedCache) {
  RotatingKVCache c(8, 1);
  for (int i = 0; i < 10; ++i) c.update_and_fetch(rows(1, i), rows(1, i));
  auto q = c.to_quantized(64, 4);
  auto* rq = dynamic_cast<RotatingQuantizedKVCache*>(q.get());
  ASSERT_NE(rq, nullptr);
  EXPECT_EQ(rq->offset(), 10);
  EXPECT_EQ(rq->idx(), c.idx());
  EXPECT_EQ(rq->max_size(), 8);
  EXPECT_EQ(rq->keep(), 1);
  ASSERT_TRUE(rq->quantization());
  EXPECT_EQ(rq->quantization()->bits, 4);
  EXPECT_EQ(rq->to_quantized(64, 8), nullptr);  // already quantized: left alone
  EXPECT_THROW(rq->update_and_fetch(rows(1, 1), rows(1, 1)), Error);
  EXPECT_THROW(RotatingQuantizedKVCache(8, 0, 64, 7), Error);
  EXPECT_THROW(RotatingKVCache(0), Error);
  EXPECT_THROW(RotatingKVCache(4, 4), Error);
}

// A bypass trim drops rows of the last multi-token write only, and keeps at least one of them.
TEST(RotatingKVCache, BypassTrimRefusesRowsItCannotDrop) {
  RotatingKVCache c(8);
  c.update_and_fetch(rows(5, 1), rows(5, 1));
  EXPECT_THROW(c.trim(5, true), Error);
  EXPECT_EQ(c.trim(2, true), 2);
  EXPECT_EQ(c.offset(), 3);
  EXPECT_EQ(c.state()[0].shape(2), 3);
  EXPECT_EQ(c.trim(2, true), 2);
  EXPECT_EQ(c.idx(), 1);
  EXPECT_THROW(c.trim(1, true), Error);  // one row of that write left
  c.update_and_fetch(rows(1, 2), rows(1, 2));
  EXPECT_THROW(c.trim(1, true), Error);  // single-token write: ring order
  EXPECT_EQ(c.trim(1), 1);               // mlx-lm's trim, before the wrap
}

// ring_reserve + the caller's own write + ring_commit (the fused CPU layer's use) leaves the
// ring as update_and_fetch does, and the rows it says attention reads are the ones
// update_and_fetch returns: steps of 1 to 5 rows through a window of 8 (growth, the wrap, a
// multi-token write past the window, a trim before the wrap), distinct rows every step.
TEST(RotatingKVCache, ReserveAndCommitMatchUpdateAndFetch) {
  for (int keep : {0, 2}) {
    RotatingKVCache ref(8, keep), ring(8, keep);
    const std::vector<int> steps = {3, 1, 1, 1, 1, 1, 1, 2, 1, 1, 5, 1, 1, 1, 4, 1};
    float v = 1;
    for (size_t i = 0; i < steps.size(); ++i) {
      const int L = steps[i];
      if (i == 2) {  // mlx-lm's trim before the wrap, on both
        ASSERT_EQ(ref.trim(1), 1);
        ASSERT_EQ(ring.trim(1), 1);
      }
      mx::array k = mx::reshape(mx::arange(v, v + L, mx::float32), {1, 1, L, 1});
      k = mx::add(k, mx::zeros({1, 2, L, 64}));
      mx::array val = mx::negative(k);
      v += L;
      auto [rk, rv] = ref.update_and_fetch(k, val);
      auto s = ring.ring_reserve(1, 2, L, {{64, mx::float32}, {64, mx::float32}});
      ASSERT_EQ(s.parts.size(), 2u);
      ASSERT_LE(s.rows, s.parts[0].shape(2));
      if (L > 1) {
        EXPECT_EQ(s.pos + L, s.rows) << "step " << i;
      }
      ring.ring_commit({seq_assign(s.parts[0], k, s.pos), seq_assign(s.parts[1], val, s.pos)}, L);
      SCOPED_TRACE("keep " + std::to_string(keep) + " step " + std::to_string(i));
      EXPECT_EQ(ring.offset(), ref.offset());
      EXPECT_EQ(ring.idx(), ref.idx());
      EXPECT_EQ(ring.rollback_rows(), ref.rollback_rows());
      const auto got = ring.state(), want = ref.state();
      EXPECT_TRUE(identical(got[0], want[0]));
      EXPECT_TRUE(identical(got[1], want[1]));
      EXPECT_TRUE(identical(seq_slice(got[0], 0, s.rows), rk));
      EXPECT_TRUE(identical(seq_slice(got[1], 0, s.rows), rv));
    }
  }
}

TEST(QuantizedKVCache, StoresTriplesOnly) {
  QuantizedKVCache c(64, 4);
  ASSERT_TRUE(c.quantization().has_value());
  EXPECT_EQ(c.quantization()->bits, 4);
  EXPECT_THROW(c.update_and_fetch(rows(1, 1), rows(1, 1)), Error);
  EXPECT_THROW(c.update_and_fetch_quantized(rows(1, 1, 48), rows(1, 1, 48)), Error);
  EXPECT_THROW(QuantizedKVCache(64, 7), Error);
  EXPECT_THROW(QuantizedKVCache(48, 4), Error);
  KVCache plain;
  EXPECT_FALSE(plain.quantization().has_value());
  EXPECT_THROW(plain.update_and_fetch_quantized(rows(1, 1), rows(1, 1)), Error);
}

// bf16 head_dim 64: 256 bytes per token and KV head for K + V; 4-bit group 64: 32 packed bytes
// plus a bf16 scale and bias each, 72 bytes.
TEST(QuantizedKVCache, BytesPerTokenShrinkByTheExpectedFactor) {
  KVCache plain;
  plain.update_and_fetch(rows(10, 1), rows(10, 1));
  ASSERT_EQ(plain.capacity(), 256);
  EXPECT_EQ(plain.nbytes() / plain.capacity(), 2u * 256);
  auto q4 = plain.to_quantized(64, 4);
  ASSERT_EQ(q4->capacity(), 256);
  EXPECT_EQ(q4->nbytes() / q4->capacity(), 2u * 72);
  auto q8 = plain.to_quantized(32, 8);
  EXPECT_EQ(q8->nbytes() / q8->capacity(), 2u * 2 * (64 + 2 * 2 * 2));
}

TEST(MaybeQuantizeKVCache, ConvertsPlainCachesFromTheStartOffset) {
  Cache cache;
  cache.push_back(std::make_unique<KVCache>());
  cache.push_back(std::make_unique<KVCache>());
  cache.push_back(std::make_unique<RotatingKVCache>(8));
  cache[0]->update_and_fetch(rows(5, 1), rows(5, 1));
  cache[1]->update_and_fetch(rows(3, 1), rows(3, 1));
  cache[2]->update_and_fetch(rows(3, 1), rows(3, 1));
  GenerateOptions o;
  maybe_quantize_kv_cache(cache, o);  // kv_bits unset: nothing happens
  EXPECT_FALSE(cache[0]->quantization());
  o.kv_bits = 8;
  o.kv_group_size = 32;
  o.quantized_kv_start = 4;
  maybe_quantize_kv_cache(cache, o);
  ASSERT_TRUE(cache[0]->quantization());
  EXPECT_EQ(cache[0]->quantization()->group_size, 32);
  EXPECT_EQ(cache[0]->offset(), 5);
  EXPECT_FALSE(cache[1]->quantization());  // offset 3 < 4
  EXPECT_FALSE(cache[2]->quantization());
  o.quantized_kv_start = 3;  // now the rotating cache qualifies (mlx-lm would raise)
  maybe_quantize_kv_cache(cache, o);
  EXPECT_TRUE(cache[1]->quantization());
  EXPECT_NE(dynamic_cast<RotatingQuantizedKVCache*>(cache[2].get()), nullptr);
}

// kv_config entries quantize their layer at their own bits from the first token; kv_bits and
// quantized_kv_start cover the other layers.
TEST(MaybeQuantizeKVCache, PerLayerBitsFromKvConfig) {
  Cache cache;
  for (int i = 0; i < 3; ++i) cache.push_back(std::make_unique<KVCache>());
  cache.push_back(std::make_unique<RotatingKVCache>(8));
  for (int i = 0; i < 3; ++i) cache[i]->update_and_fetch(rows(2, 1), rows(2, 1));
  GenerateOptions o;
  o.kv_config = std::vector<KVLayerBits>{{0, 4, 32}, {3, 8, 64}};
  maybe_quantize_kv_cache(cache, o);
  ASSERT_TRUE(cache[0]->quantization());
  EXPECT_EQ(cache[0]->quantization()->bits, 4);
  EXPECT_EQ(cache[0]->quantization()->group_size, 32);
  EXPECT_FALSE(cache[1]->quantization());  // not listed, kv_bits unset
  EXPECT_FALSE(cache[3]->quantization());  // listed but still empty
  cache[3]->update_and_fetch(rows(1, 1), rows(1, 1));
  o.kv_bits = 2;
  o.quantized_kv_start = 2;
  maybe_quantize_kv_cache(cache, o);
  ASSERT_TRUE(cache[3]->quantization());
  EXPECT_EQ(cache[3]->quantization()->bits, 8);
  EXPECT_EQ(cache[0]->quantization()->bits, 4);  // converted once
  ASSERT_TRUE(cache[1]->quantization());
  EXPECT_EQ(cache[1]->quantization()->bits, 2);
}

}  // namespace
}  // namespace lmx
