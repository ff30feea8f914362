// LoRA adapters chosen per request: the admin endpoints and a request's choice
// (docs/server.md). Loading and unloading run between two scheduler steps (Engine).
#include <filesystem>

#include "core/error.h"
#include "server/context.h"

namespace lmx::server {

namespace fs = std::filesystem;

namespace {

ojson adapter_json(const AdapterInfo& a) {
  return {{"id", a.name},   {"object", "adapter"}, {"path", a.path.string()},
          {"rank", a.rank}, {"scale", a.scale},    {"modules", a.modules}};
}

// The directory, resolved (symbolic links too), if it lies under --adapter-root; else 403.
fs::path under_root(const Context& ctx, const std::string& path, const std::string& field) {
  if (!ctx.options.adapter_root)
    throw ApiError(403,
                   "loading adapters at run time is off; start the server with --adapter-root "
                   "DIR to allow directories under DIR",
                   field, "permission_error", "adapter_root");
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(*ctx.options.adapter_root, ec);
  const fs::path dir = fs::weakly_canonical(path, ec);
  auto r = root.begin(), d = dir.begin();
  for (; r != root.end() && d != dir.end() && *r == *d; ++r, ++d) {
  }
  const bool inside = !ec && r == root.end() && d != dir.end();
  if (!inside)
    throw ApiError(403,
                   "adapter path '" + path + "' is outside the server's --adapter-root " +
                       ctx.options.adapter_root->string(),
                   field, "permission_error", "adapter_outside_root");
  return dir;
}

void load(const Context& ctx, const std::string& name, const fs::path& dir,
          const std::string& field) {
  try {
    ctx.engine->load_adapter(name, dir);
  } catch (const lmx::Error& e) {
    if (ctx.engine->has_adapter(name))
      throw ApiError(409, e.what(), field, "invalid_request_error", "adapter_exists");
    throw ApiError(400, e.what(), field);
  }
}

std::string body_string(const ojson& b, const char* key, const char* alt = nullptr) {
  const char* k = b.contains(key) || !alt ? key : alt;
  if (!b.contains(k) || !b[k].is_string() || b[k].get<std::string>().empty())
    bad_field(key, "is required: a non-empty string");
  return b[k].get<std::string>();
}

}  // namespace

std::string resolve_adapter(const Context& ctx, const SamplingRequest& s) {
  if (!s.adapter.empty()) {
    if (!ctx.engine->has_adapter(s.adapter))
      throw ApiError(404, "The adapter '" + s.adapter + "' is not loaded", "adapter",
                     "invalid_request_error", "adapter_not_found");
    return s.adapter;
  }
  if (s.adapter_path && !s.adapter_path->empty()) {
    if (auto name = ctx.engine->adapter_at(*s.adapter_path)) return *name;
    const fs::path dir = under_root(ctx, *s.adapter_path, "adapters");
    const std::string name = dir.string();
    // Two requests may load the same directory at once: the second finds the first's.
    if (!ctx.engine->has_adapter(name)) {
      try {
        ctx.engine->load_adapter(name, dir);
      } catch (const lmx::Error& e) {
        if (!ctx.engine->has_adapter(name)) throw ApiError(400, e.what(), "adapters");
      }
    }
    return name;
  }
  if (ctx.engine->has_adapter(s.model)) return s.model;
  return "";
}

void handle_list_adapters(const Context& ctx, const httplib::Request&, httplib::Response& res) {
  ojson data = ojson::array();
  for (const auto& a : ctx.engine->adapters()) data.push_back(adapter_json(a));
  send_json(res, {{"object", "list"}, {"data", data}});
}

void handle_load_adapter(const Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const ojson b = parse_body(req.body);
  const bool vllm = req.path.find("load_lora_adapter") != std::string::npos;
  const std::string name = vllm ? body_string(b, "lora_name") : body_string(b, "id", "name");
  const std::string path = vllm ? body_string(b, "lora_path") : body_string(b, "path");
  if (name == ctx.model_id || name == "default_model")
    bad_field(vllm ? "lora_name" : "id", "names the base model; choose another name");
  if (ctx.engine->has_adapter(name))
    throw ApiError(409, "An adapter named '" + name + "' is already loaded",
                   vllm ? "lora_name" : "id", "invalid_request_error", "adapter_exists");
  const fs::path dir = under_root(ctx, path, vllm ? "lora_path" : "path");
  load(ctx, name, dir, vllm ? "lora_path" : "path");
  for (const auto& a : ctx.engine->adapters())
    if (a.name == name) return send_json(res, adapter_json(a));
}

void handle_unload_adapter(const Context& ctx, const httplib::Request& req,
                           httplib::Response& res) {
  std::string name;
  if (req.matches.size() > 1) {
    name = req.matches[1];
  } else {
    name = body_string(parse_body(req.body), "lora_name");
  }
  if (!ctx.engine->has_adapter(name))
    throw ApiError(404, "The adapter '" + name + "' is not loaded", "id", "invalid_request_error",
                   "adapter_not_found");
  try {
    ctx.engine->unload_adapter(name);
  } catch (const lmx::Error& e) {
    // Still there: a running request holds it.
    if (ctx.engine->has_adapter(name))
      throw ApiError(409, e.what(), "id", "invalid_request_error", "adapter_in_use");
    throw ApiError(404, e.what(), "id", "invalid_request_error", "adapter_not_found");
  }
  send_json(res, {{"id", name}, {"object", "adapter"}, {"deleted", true}});
}

}  // namespace lmx::server
