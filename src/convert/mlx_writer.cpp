#include "convert/mlx_writer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/progress.h"

namespace lmx::convert {

namespace fs = std::filesystem;

namespace {

// Compares names piecewise so that "layers.10" sorts after "layers.9".
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string na = a.substr(i, ie - i), nb = b.substr(j, je - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

int rank(const std::string& name) {
  if (name.find("embed_tokens") != std::string::npos) return 0;
  if (name.find(".layers.") != std::string::npos) return 1;
  if (name.find("lm_head") != std::string::npos) return 3;
  return 2;
}

std::string module_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

std::string leaf_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace

std::vector<std::string> ordered_names(const Weights& weights) {
  std::vector<std::string> names;
  names.reserve(weights.size());
  for (const auto& [k, v] : weights) names.push_back(k);
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    const int ra = rank(a), rb = rank(b);
    if (ra != rb) return ra < rb;
    return natural_less(a, b);
  });
  return names;
}

int64_t total_parameters(const Weights& weights, const QuantMap& quantized) {
  // It sums the leaf modules' parameters: a parameter of a module with children (the
  // gated-DeltaNet layers' A_log and dt_bias, gpt_oss's attention sinks) is not counted.
  std::set<std::string> parents;
  for (const auto& [name, a] : weights) {
    for (std::string m = module_of(module_of(name)); !m.empty(); m = module_of(m)) {
      if (!parents.insert(m).second) break;
    }
  }
  int64_t n = 0;
  for (const auto& [name, a] : weights) {
    if (parents.count(module_of(name))) continue;
    auto q = quantized.find(module_of(name));
    if (q == quantized.end()) {
      n += a.size();
      continue;
    }
    const std::string leaf = leaf_of(name);
    if (leaf == "weight") {
      n += static_cast<int64_t>(a.size()) * 32 / q->second.bits;
    } else if (leaf != "scales" && leaf != "biases") {
      n += a.size();
    }
  }
  return n;
}

void save_weights(const fs::path& dir, const Weights& weights, const QuantMap& quantized,
                  uint64_t max_shard_bytes, bool progress) {
  const std::vector<std::string> names = ordered_names(weights);
  // mlx-lm make_shards: start a new shard when the next tensor would pass the limit.
  std::vector<std::vector<std::string>> shards;
  uint64_t shard_size = 0, total_size = 0;
  for (const auto& k : names) {
    const uint64_t nb = weights.at(k).nbytes();
    if (shards.empty() || shard_size + nb > max_shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().push_back(k);
    shard_size += nb;
    total_size += nb;
  }
  ojson index;
  index["metadata"]["total_size"] = total_size;
  index["metadata"]["total_parameters"] = total_parameters(weights, quantized);
  std::map<std::string, std::string> weight_map;
  // The conversion's work (casts, quantization, GGUF repacking) is lazy: it runs here, tensor by
  // tensor, which is what the bar counts.
  ProgressBar bar("converting", total_size, 0, {.enabled = progress});
  uint64_t done = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string file = "model.safetensors";
    if (shards.size() > 1) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      file = buf;
    }
    Weights shard;
    for (const auto& k : shards[i]) {
      const mx::array& a = weights.at(k);
      if (progress) {
        mx::eval(a);
        done += a.nbytes();
        bar.update(done);
      }
      shard.emplace(k, a);
      weight_map[k] = file;
    }
    save_safetensors(dir / file, shard);
  }
  bar.finish();
  ojson wm = ojson::object();
  for (const auto& [k, f] : weight_map) wm[k] = f;
  index["weight_map"] = wm;
  write_json(dir / "model.safetensors.index.json", index, 4);
}

ojson quantization_block(const QuantParams& defaults, const QuantMap& overrides) {
  ojson q;
  q["group_size"] = defaults.group_size;
  q["bits"] = defaults.bits;
  q["mode"] = "affine";
  for (const auto& [path, p] : overrides) {
    q[path] = {{"group_size", p.group_size}, {"bits", p.bits}};
  }
  return q;
}

void save_config(const fs::path& path, ojson config) {
  config.erase("_name_or_path");
  config.erase("vision_config");
  if (config.contains("quantization")) config["quantization_config"] = config["quantization"];
  std::vector<std::string> keys;
  for (auto it = config.begin(); it != config.end(); ++it) keys.push_back(it.key());
  std::sort(keys.begin(), keys.end());
  ojson sorted = ojson::object();
  for (const auto& k : keys) sorted[k] = config[k];
  write_json(path, sorted, 4, /*ensure_ascii=*/true);
}

void write_json(const fs::path& path, const ojson& j, int indent, bool ensure_ascii) {
  std::string s;
  try {
    s = j.dump(indent, ' ', ensure_ascii);
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), "cannot serialize JSON: ", e.what());
  }
  std::ofstream f(path, std::ios::binary);
  check(f.good(), path.string(), "cannot open for writing");
  f << s;
  f.close();
  check(f.good(), path.string(), "write failed");
}

ojson read_ojson(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  check(f.good(), path.string(), "cannot open file");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return ojson::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), "invalid JSON: ", e.what());
  }
}

StagingDir::StagingDir(const fs::path& dst) : dst_(dst) {
  if (fs::exists(dst)) {
    check(fs::is_directory(dst) && fs::is_empty(dst), dst.string(),
          "destination already exists; delete it or choose another --mlx-path");
  }
  tmp_ = dst;
  tmp_ += ".partial";
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  fs::create_directories(tmp_, ec);
  check(!ec, tmp_.string(), "cannot create directory: ", ec.message());
}

StagingDir::~StagingDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

void StagingDir::commit() {
  std::error_code ec;
  if (fs::exists(dst_)) fs::remove(dst_, ec);  // an empty directory (checked in the constructor)
  fs::rename(tmp_, dst_, ec);
  check(!ec, dst_.string(), "cannot move ", tmp_.string(), " into place: ", ec.message());
  committed_ = true;
}

}  // namespace lmx::convert
