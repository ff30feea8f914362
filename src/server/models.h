// The models one server serves (several --model, --models-dir): each request's `model` picks one
// by id or alias; models load on first use and stay within --max-loaded-models and
// --memory-budget, the least recently used idle one unloaded to make room (as mlx_lm.server,
// Ollama and LM Studio do).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/context.h"
#include "server/metrics.h"

namespace lmx::server {

struct ModelSpec {
  std::string id;                    // the name /v1/models lists
  std::filesystem::path path;        // the model directory
  std::vector<std::string> aliases;  // other names requests may use
  size_t weight_bytes = 0;           // the safetensors files' size
};

struct ModelsOptions {
  int max_loaded = 1;
  std::optional<size_t> memory_budget;  // bytes of weights loaded at once
  bool any_name = false;                // --any-model-name: unknown names get the first model
  // How long a request waits for a busy model to become idle so another can load.
  std::chrono::milliseconds busy_wait{120000};
};

// The specs of every subdirectory of `dir` that holds a config.json, by name.
std::vector<ModelSpec> scan_models_dir(const std::filesystem::path& dir);
size_t weight_bytes(const std::filesystem::path& model_dir);

class Models {
 public:
  using Factory = std::function<std::shared_ptr<Context>(const ModelSpec&)>;
  // specs[0] is the default model (empty `model`, "default_model"); it loads here.
  Models(std::vector<ModelSpec> specs, ModelsOptions options, Factory make, Metrics* metrics);
  ~Models();

  // The model a request names, loaded if it is not (on this thread). ApiError 404 (unknown
  // name: the message lists the ids), 400 (larger than the memory budget), 503 (every loaded
  // model busy for busy_wait).
  std::shared_ptr<Context> get(const std::string& name);
  // Loaded already, or null; never loads (GET /v1/models/{id}).
  std::shared_ptr<Context> loaded(const std::string& name) const;
  // The model `name` is (id, alias or a loaded adapter's name); null when unknown, even with
  // any_name.
  const ModelSpec* spec(const std::string& name) const { return find(name, false); }
  const std::vector<ModelSpec>& specs() const { return specs_; }
  std::vector<std::shared_ptr<Context>> loaded() const;  // most recently used first
  // Stops every loaded model's scheduler (their open jobs end "cancelled").
  void stop();

 private:
  struct Loaded {
    const ModelSpec* spec;
    std::shared_ptr<Context> ctx;
  };
  // By id, alias or a loaded adapter's name; with `fallback`, "" / "default_model" (and any
  // name with any_name) give the first.
  const ModelSpec* find(const std::string& name, bool fallback = true) const;
  void make_room(const ModelSpec& want);  // with load_mu_ held

  std::vector<ModelSpec> specs_;
  ModelsOptions options_;
  Factory make_;
  Metrics* metrics_;
  mutable std::mutex mu_;     // loaded_
  std::mutex load_mu_;        // one load (and its evictions) at a time
  std::list<Loaded> loaded_;  // front: most recently used
};

}  // namespace lmx::server
