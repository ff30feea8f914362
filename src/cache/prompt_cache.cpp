#include "cache/prompt_cache.h"

#include <algorithm>
#include <utility>

#include "cache/arrays_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "cache/rotating_quantized_kv_cache.h"
#include "core/error.h"

namespace lmx {

namespace {

// tree_flatten of [cache.state for cache in caches], with mlx-lm's scalar bookkeeping.
class StateWriter {
 public:
  void array(const std::string& key, const mx::array& a) { arrays_.insert_or_assign(key, a); }
  void scalar(const std::string& key, int v) {
    array(key, mx::array(v));
    scalars_.emplace_back(key, "scalar");
  }
  void none(const std::string& key) {
    array(key, mx::zeros({0}, mx::float32));
    scalars_.emplace_back(key, "none");
  }
  void optional(const std::string& key, const std::optional<mx::array>& a) {
    if (a) {
      array(key, *a);
    } else {
      none(key);
    }
  }

  // Keys and values as quantized triples: p0.0-2 and p1.0-2 (none when empty).
  void triples(const std::string& p, const std::vector<mx::array>& state) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::string key = p + std::to_string(kv);
      if (state.empty()) {
        none(key);
      } else {
        for (int part = 0; part < 3; ++part)
          array(key + "." + std::to_string(part), state[kv * 3 + part]);
      }
    }
  }

  Weights arrays_;
  std::vector<std::pair<std::string, std::string>> scalars_;
};

}  // namespace

void save_prompt_cache(const std::filesystem::path& file, const Cache& cache,
                       const Metadata& metadata) {
  StateWriter w;
  Metadata meta;
  for (const auto& [k, v] : metadata) meta["0." + k] = v;
  for (size_t i = 0; i < cache.size(); ++i) {
    const std::string p = std::to_string(i) + ".";
    const KVCacheBase* c = cache[i].get();
    std::vector<mx::array> state = c->state();
    auto at = [&](size_t j) -> std::optional<mx::array> {
      if (state.empty()) return std::nullopt;
      return state[j];
    };
    std::string cls;
    if (const auto* ac = dynamic_cast<const ArraysCache*>(c)) {
      // state = (cache, left_padding, lengths): the slots as p0.<slot>, no padding, no lengths.
      cls = "ArraysCache";
      for (int slot = 0; slot < ArraysCache::kSize; ++slot)
        w.optional(p + "0." + std::to_string(slot), (*ac)[slot]);
      w.none(p + "1");
      w.none(p + "2");
    } else if (const auto* r = dynamic_cast<const RotatingKVCache*>(c)) {
      cls = "RotatingKVCache";
      w.optional(p + "0", at(0));
      w.optional(p + "1", at(1));
      w.scalar(p + "2", r->offset());
      w.scalar(p + "3", r->keep());
      w.scalar(p + "4", r->max_size());
      w.scalar(p + "5", r->idx());
    } else if (const auto* rq = dynamic_cast<const RotatingQuantizedKVCache*>(c)) {
      // lmx's own class (mlx-lm has none): RotatingKVCache's state with the triples of
      // QuantizedKVCache, then group_size and bits.
      cls = "RotatingQuantizedKVCache";
      w.triples(p, state);
      w.scalar(p + "2", rq->offset());
      w.scalar(p + "3", rq->keep());
      w.scalar(p + "4", rq->max_size());
      w.scalar(p + "5", rq->idx());
      w.scalar(p + "6", rq->group_size());
      w.scalar(p + "7", rq->bits());
    } else if (const auto* q = dynamic_cast<const QuantizedKVCache*>(c)) {
      cls = "QuantizedKVCache";
      w.triples(p, state);
      w.scalar(p + "2", q->offset());
      w.scalar(p + "3", q->group_size());
      w.scalar(p + "4", q->bits());
    } else if (dynamic_cast<const KVCache*>(c)) {
      cls = "KVCache";
      w.optional(p + "0", at(0));
      w.optional(p + "1", at(1));
      w.scalar(p + "2", c->offset());
    } else {
      fail(file.string(), "layer ", i,
           ": only KVCache, RotatingKVCache, QuantizedKVCache, RotatingQuantizedKVCache and ",
           "ArraysCache can be saved");
    }
    meta["1." + std::to_string(i)] = cls;
  }
  meta["2.0"] = "";
  for (size_t n = 0; n < w.scalars_.size(); ++n) {
    const std::string p = "2." + std::to_string(n + 1) + ".";
    meta[p + "0"] = w.scalars_[n].first;
    meta[p + "1"] = w.scalars_[n].second;
  }
  save_safetensors(file, w.arrays_, meta);
}

PromptCache load_prompt_cache(const std::filesystem::path& file) {
  const std::string where = file.string();
  Metadata meta;
  Weights arrays = load_safetensors(file, &meta);
  PromptCache out;
  std::map<int, std::string> classes;
  std::map<std::string, std::string> kinds;  // array key -> "scalar" / "none"
  std::map<int, std::pair<std::string, std::string>> scalars;
  auto index = [&](const std::string& k, const std::string& digits) {
    check(
        !digits.empty() && digits.size() < 9 &&
            std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }),
        where, "bad prompt-cache metadata key '", k, "'");
    return std::stoi(digits);
  };
  for (const auto& [k, v] : meta) {
    if (k.starts_with("0.")) {
      out.metadata[k.substr(2)] = v;
    } else if (k.starts_with("1.")) {
      classes[index(k, k.substr(2))] = v;
    } else if (k.starts_with("2.") && k != "2.0") {
      const size_t dot = k.find('.', 2);
      check(dot != std::string::npos, where, "bad prompt-cache metadata key '", k, "'");
      auto& s = scalars[index(k, k.substr(2, dot - 2))];
      (k.substr(dot + 1) == "0" ? s.first : s.second) = v;
    }
  }
  for (const auto& [n, s] : scalars) kinds[s.first] = s.second;
  auto get = [&](const std::string& key) -> const mx::array& {
    auto it = arrays.find(key);
    check(it != arrays.end(), where, "prompt cache: missing array '", key, "'");
    return it->second;
  };
  auto is_none = [&](const std::string& key) {
    auto it = kinds.find(key);
    return it != kinds.end() && it->second == "none";
  };
  auto scalar = [&](const std::string& key) {
    const mx::array& a = get(key);
    check(a.ndim() == 0 && kinds[key] == "scalar", where, "prompt cache: '", key,
          "' should be a scalar, got shape ", shape_str(a.shape()));
    return mx::astype(a, mx::int32).item<int>();
  };
  auto optional = [&](const std::string& key) -> std::optional<mx::array> {
    if (is_none(key)) return std::nullopt;
    return get(key);
  };
  auto triple = [&](const std::string& key) -> std::optional<QuantizedArray> {
    if (is_none(key)) return std::nullopt;
    return QuantizedArray{get(key + ".0"), get(key + ".1"), get(key + ".2")};
  };
  // Keys and values are both there or both None (an empty cache): one alone crashed nbytes().
  auto both = [&](const std::string& p, const auto& k, const auto& v) {
    check(k.has_value() == v.has_value(), where, "prompt cache: layer ", p,
          " has keys or values without the other, expected both or neither");
  };
  int expect = 0;
  for (const auto& [i, cls] : classes) {
    check(i == expect++, where, "prompt cache: class entries are not numbered 0..n-1");
    const std::string p = std::to_string(i) + ".";
    if (cls == "KVCache") {
      auto c = std::make_unique<KVCache>();
      auto k = optional(p + "0"), v = optional(p + "1");
      both(p, k, v);
      c->set_state(std::move(k), std::move(v), scalar(p + "2"));
      out.cache.push_back(std::move(c));
    } else if (cls == "RotatingKVCache") {
      auto c = std::make_unique<RotatingKVCache>(scalar(p + "4"), scalar(p + "3"));
      auto k = optional(p + "0"), v = optional(p + "1");
      both(p, k, v);
      c->set_state(std::move(k), std::move(v), scalar(p + "2"), scalar(p + "5"));
      out.cache.push_back(std::move(c));
    } else if (cls == "QuantizedKVCache") {
      auto c = std::make_unique<QuantizedKVCache>(scalar(p + "3"), scalar(p + "4"));
      auto k = triple(p + "0"), v = triple(p + "1");
      both(p, k, v);
      c->set_state(std::move(k), std::move(v), scalar(p + "2"));
      out.cache.push_back(std::move(c));
    } else if (cls == "RotatingQuantizedKVCache") {
      auto c = std::make_unique<RotatingQuantizedKVCache>(scalar(p + "4"), scalar(p + "3"),
                                                          scalar(p + "6"), scalar(p + "7"));
      auto k = triple(p + "0"), v = triple(p + "1");
      both(p, k, v);
      c->set_state(std::move(k), std::move(v), scalar(p + "2"), scalar(p + "5"));
      out.cache.push_back(std::move(c));
    } else if (cls == "ArraysCache") {
      check(is_none(p + "1") && is_none(p + "2"), where, "layer ", i,
            ": an ArraysCache with left padding or lengths (a batch being prefilled) cannot be ",
            "loaded, expected both none");
      auto c = std::make_unique<ArraysCache>();
      c->set_state(optional(p + "0.0"), optional(p + "0.1"), 0);
      out.cache.push_back(std::move(c));
    } else {
      fail(where, "layer ", i, ": unsupported prompt-cache class '", cls,
           "', expected KVCache, RotatingKVCache, QuantizedKVCache, ",
           "RotatingQuantizedKVCache or ArraysCache");
    }
  }
  // mlx-lm's ArraysCache keeps no token count: a linear-attention state has seen as many tokens
  // as the model's attention caches (the first one that counts them).
  int offset = 0;
  for (const auto& c : out.cache)
    if (!dynamic_cast<const ArraysCache*>(c.get())) {
      offset = c->offset();
      break;
    }
  for (auto& c : out.cache)
    if (auto* ac = dynamic_cast<ArraysCache*>(c.get()); ac && !ac->state().empty())
      ac->set_state((*ac)[0], (*ac)[1], offset);
  return out;
}

}  // namespace lmx
