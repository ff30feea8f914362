// LoRA adapters chosen per request (docs/lora.md, docs/batching.md): the model's adapter sites
// (every Linear and Embedding, registered as they load), the adapters loaded by name at run time,
// and, during one forward, which rows of the batch take which adapter. A layer adds each adapter's
// low-rank term to the rows that chose it: the base matmul runs once for the whole batch.
#pragma once

#include <mlx/mlx.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace lmx::nn {

namespace mx = mlx::core;

class AdapterRouter {
 public:
  struct Site {
    std::string path;  // the module's checkpoint path, e.g. model.layers.3.self_attn.q_proj
    bool embedding = false;
    int in = 0, out = 0;  // Linear: input and output sizes; Embedding: vocabulary and dims
  };
  // One adapter's modules, indexed by site (null where the adapter leaves the module alone).
  struct Modules {
    std::vector<std::shared_ptr<const LinearAdapter>> linear;
    std::vector<std::shared_ptr<const EmbeddingAdapter>> embedding;
  };
  struct Info {
    std::string name;
    std::filesystem::path path;
    int rank = 0;
    float scale = 0;
    int modules = 0;      // sites the adapter changes
    uint64_t serial = 0;  // distinct for every load: names the adapter in prompt-cache keys
  };

  // At load: a module that may take adapters. Returns its site id.
  int add_site(Site site);
  const std::vector<Site>& sites() const { return sites_; }

  // Adds an adapter under a new name (the model's thread). Throws lmx::Error for a name already
  // loaded.
  void add(Info info, Modules modules);
  // Throws lmx::Error for an unknown name or an adapter some generation still uses.
  void remove(const std::string& name);
  std::vector<Info> list() const;
  bool has(const std::string& name) const;

  // A generation's hold on an adapter while it runs (remove() refuses it meanwhile). Throws
  // lmx::Error naming the adapter and the loaded ones when `name` is not loaded.
  int acquire(const std::string& name);
  void release(int slot);
  uint64_t serial(int slot) const;
  // Names a loaded adapter in prompt-cache keys: "<name>#<serial>" (a reload under the same name
  // never meets the caches of the one before). Throws lmx::Error for an unknown name.
  std::string cache_key(const std::string& name) const;

  // The rows of the next forward: slot per row, -1 for the base model. Cleared by clear_route().
  void route(const std::vector<int>& slot_per_row);
  void clear_route() { route_.clear(); }
  // Whether a routed adapter changes this site in the current forward (the fused L3 layer then
  // steps aside for the op-by-op path).
  bool applies(int site) const;

  // y: the module's output for x; adds each routed adapter's term on its own rows.
  mx::array linear(int site, const mx::array& x, const mx::array& y) const;
  mx::array lookup(int site, const mx::array& ids, const mx::array& y) const;
  mx::array head(int site, const mx::array& x, const mx::array& y) const;

 private:
  struct Slot {
    Info info;
    Modules modules;
    int users = 0;
  };
  struct Route {
    int slot;
    std::optional<mx::array> rows;  // (B,) bool; unset: every row
  };
  template <typename F>
  mx::array apply(const mx::array& y, int batch, F&& term) const;

  std::vector<Site> sites_;
  // Guards the tables for the name queries of other threads; adding, removing and the forward
  // all run on the thread that owns the model.
  mutable std::mutex mu_;
  std::map<int, Slot> slots_;
  std::map<std::string, int> by_name_;
  int next_slot_ = 0;
  uint64_t next_serial_ = 1;
  std::vector<Route> route_;
  int route_rows_ = 0;
};

// Routes one forward's rows for as long as it lives.
class RouteGuard {
 public:
  RouteGuard(AdapterRouter* router, const std::vector<int>& slot_per_row) : router_(router) {
    if (router_) router_->route(slot_per_row);
  }
  ~RouteGuard() {
    if (router_) router_->clear_route();
  }
  RouteGuard(const RouteGuard&) = delete;
  RouteGuard& operator=(const RouteGuard&) = delete;

 private:
  AdapterRouter* router_;
};

}  // namespace lmx::nn
