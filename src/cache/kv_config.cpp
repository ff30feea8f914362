#include "cache/kv_config.h"

#include <set>

#include "core/json.h"

namespace lmx {

namespace {

bool supported_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }

}  // namespace

void validate_kv_config(const std::vector<KVLayerBits>& config, int num_caches,
                        const std::string& where) {
  std::set<int> seen;
  for (size_t i = 0; i < config.size(); ++i) {
    const KVLayerBits& e = config[i];
    const std::string entry =
        "entry " + std::to_string(i) + " (layer_idx " + std::to_string(e.layer) + ")";
    check(e.layer >= 0 && e.layer < num_caches, where, entry, ": layer out of range, expected 0..",
          num_caches - 1, " (the layers with their own KV cache)");
    check(supported_bits(e.bits), where, entry, ": bits ", e.bits,
          " not supported, expected one of 2, 3, 4, 5, 6, 8");
    check(e.group_size == 32 || e.group_size == 64 || e.group_size == 128, where, entry,
          ": group_size ", e.group_size, " not supported, expected 32, 64 or 128");
    check(seen.insert(e.layer).second, where, entry, ": the layer is listed twice");
  }
}

std::vector<KVLayerBits> read_kv_config(const std::filesystem::path& file, int num_caches) {
  const std::string where = file.string();
  const json j = read_json_file(file);
  check(j.is_array(), where, "expected a JSON list of {layer_idx, bits, group_size}, got ",
        j.type_name());
  std::vector<KVLayerBits> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string entry = where + ": entry " + std::to_string(i);
    check(j[i].is_object(), entry, "expected an object {layer_idx, bits, group_size}, got ",
          j[i].dump());
    const JsonView v{j[i], entry};
    out.push_back({v.get<int>("layer_idx"), v.get<int>("bits"), v.get<int>("group_size", 64)});
  }
  validate_kv_config(out, num_caches, where);
  return out;
}

}  // namespace lmx
