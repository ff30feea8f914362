#include "server/models.h"

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "server/api_error.h"

namespace lmx::server {

namespace fs = std::filesystem;

size_t weight_bytes(const fs::path& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") n += static_cast<size_t>(e.file_size(ec));
  return n;
}

std::vector<ModelSpec> scan_models_dir(const fs::path& dir) {
  std::vector<ModelSpec> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory() || !fs::exists(e.path() / "config.json")) continue;
    ModelSpec s;
    s.id = e.path().filename().string();
    s.path = e.path();
    s.weight_bytes = weight_bytes(e.path());
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

Models::Models(std::vector<ModelSpec> specs, ModelsOptions options, Factory make, Metrics* metrics)
    : specs_(std::move(specs)), options_(options), make_(std::move(make)), metrics_(metrics) {
  check(!specs_.empty(), "serve", "no model to serve, expected --model or --models-dir");
  check(options_.max_loaded >= 1, "serve", "--max-loaded-models must be >= 1, got ",
        options_.max_loaded);
  get(specs_[0].id);
}

Models::~Models() { stop(); }

const ModelSpec* Models::find(const std::string& name, bool fallback) const {
  if (fallback && (name.empty() || name == "default_model")) return &specs_[0];
  for (const auto& s : specs_) {
    if (s.id == name || s.path.string() == name) return &s;
    if (std::find(s.aliases.begin(), s.aliases.end(), name) != s.aliases.end()) return &s;
  }
  {
    // A loaded model's adapter is a model name too (it is listed with the model as parent).
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& l : loaded_)
      if (l.ctx->engine->has_adapter(name)) return l.spec;
  }
  if (fallback && options_.any_name) return &specs_[0];
  return nullptr;
}

std::shared_ptr<Context> Models::loaded(const std::string& name) const {
  const ModelSpec* s = find(name);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& l : loaded_)
    if (l.spec == s) return l.ctx;
  return nullptr;
}

std::vector<std::shared_ptr<Context>> Models::loaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Context>> out;
  for (const auto& l : loaded_) out.push_back(l.ctx);
  return out;
}

std::shared_ptr<Context> Models::get(const std::string& name) {
  const ModelSpec* s = find(name);
  if (!s) {
    std::string ids;
    for (const auto& sp : specs_) ids += (ids.empty() ? "'" : ", '") + sp.id + "'";
    throw ApiError(404, "The model '" + name + "' does not exist; this server has " + ids, "model",
                   "invalid_request_error", "model_not_found");
  }
  auto touch = [&]() -> std::shared_ptr<Context> {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = loaded_.begin(); it != loaded_.end(); ++it)
      if (it->spec == s) {
        loaded_.splice(loaded_.begin(), loaded_, it);
        return it->ctx;
      }
    return nullptr;
  };
  if (auto ctx = touch()) return ctx;
  std::lock_guard<std::mutex> load(load_mu_);
  if (auto ctx = touch()) return ctx;  // loaded while this request waited
  if (options_.memory_budget && s->weight_bytes > *options_.memory_budget)
    throw ApiError(400,
                   "The model '" + s->id + "' needs " + std::to_string(s->weight_bytes) +
                       " bytes of weights, more than the --memory-budget of " +
                       std::to_string(*options_.memory_budget) + " bytes",
                   "model", "invalid_request_error", "memory_admission");
  make_room(*s);
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<Context> ctx = make_(*s);
  if (metrics_)
    metrics_->model_loaded(
        s->id, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::lock_guard<std::mutex> lock(mu_);
  loaded_.push_front({s, ctx});
  return ctx;
}

void Models::make_room(const ModelSpec& want) {
  const auto deadline = std::chrono::steady_clock::now() + options_.busy_wait;
  while (true) {
    std::shared_ptr<Context> victim;
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t bytes = want.weight_bytes;
      for (const auto& l : loaded_) bytes += l.spec->weight_bytes;
      const bool over_count = static_cast<int>(loaded_.size()) >= options_.max_loaded;
      const bool over_bytes = options_.memory_budget && bytes > *options_.memory_budget;
      if (!over_count && !over_bytes) return;
      // The least recently used model no request holds (this list's reference is the only one).
      for (auto it = loaded_.rbegin(); it != loaded_.rend(); ++it)
        if (it->ctx.use_count() == 1) {
          victim = std::move(it->ctx);
          if (metrics_) metrics_->model_unloaded(it->spec->id);
          loaded_.erase(std::next(it).base());
          break;
        }
    }
    if (victim) {
      // Its scheduler stops (joins) outside any lock; then the weights go.
      victim->engine->stop();
      victim.reset();
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw ApiError(503, "Every loaded model is busy; cannot load '" + want.id + "' now", "model",
                     "server_error", "model_busy");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Models::stop() {
  std::list<Loaded> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all = loaded_;
  }
  for (auto& l : all) l.ctx->engine->stop();
}

}  // namespace lmx::server
