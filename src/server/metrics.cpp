#include "server/metrics.h"

#include <algorithm>
#include <cstdio>
#include <regex>

namespace lmx::server {

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin();
  ++counts[i];
  sum += v;
  ++total;
}

namespace {

Histogram histogram(std::vector<double> bounds) {
  Histogram h{std::move(bounds), {}};
  h.counts.assign(h.bounds.size() + 1, 0);
  return h;
}

// Label values escaped as the text format requires: backslash, double quote and newline.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void write_histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += std::string(name) + "_bucket{le=\"" + number(h.bounds[i]) + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  out += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(h.total) + "\n";
  out += std::string(name) + "_sum " + number(h.sum) + "\n";
  out += std::string(name) + "_count " + std::to_string(h.total) + "\n";
}

ojson histogram_json(const Histogram& h) {
  ojson buckets = ojson::array();
  for (size_t i = 0; i < h.bounds.size(); ++i)
    buckets.push_back({{"le", h.bounds[i]}, {"count", h.counts[i]}});
  buckets.push_back({{"le", "+Inf"}, {"count", h.counts.back()}});
  return {{"count", h.total},
          {"sum", h.sum},
          {"mean", h.total ? h.sum / static_cast<double>(h.total) : 0.0},
          {"buckets", buckets}};
}

}  // namespace

Metrics::Metrics()
    : ttft_(histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})),
      itl_(histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5})),
      load_seconds_(histogram({0.5, 1, 2.5, 5, 10, 30, 60, 120})) {}

std::string Metrics::route_of(const std::string& path) {
  static const std::vector<std::pair<std::regex, std::string>> patterns = {
      {std::regex("^/v1/models/.+$"), "/v1/models/{id}"},
      {std::regex("^/v1/adapters/.+$"), "/v1/adapters/{id}"},
      {std::regex("^/v1/responses/[^/]+$"), "/v1/responses/{id}"},
      {std::regex("^/v1/responses/[^/]+/input_items$"), "/v1/responses/{id}/input_items"},
  };
  static const std::vector<std::string> routes = {"/",
                                                  "/health",
                                                  "/metrics",
                                                  "/stats",
                                                  "/v1/models",
                                                  "/v1/adapters",
                                                  "/v1/load_lora_adapter",
                                                  "/v1/unload_lora_adapter",
                                                  "/v1/chat/completions",
                                                  "/chat/completions",
                                                  "/v1/completions",
                                                  "/v1/messages",
                                                  "/v1/messages/count_tokens",
                                                  "/v1/embeddings",
                                                  "/embeddings",
                                                  "/v1/responses"};
  if (std::find(routes.begin(), routes.end(), path) != routes.end()) return path;
  for (const auto& [re, name] : patterns)
    if (std::regex_match(path, re)) return name;
  return "other";
}

void Metrics::request(const std::string& method, const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{method, route}][status];
}

void Metrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::next_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds);
}

void Metrics::finished(const std::string& model, int prompt_tokens, int generated_tokens,
                       const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_[model] += static_cast<uint64_t>(std::max(0, prompt_tokens));
  generated_tokens_[model] += static_cast<uint64_t>(std::max(0, generated_tokens));
  ++finished_[{model, finish_reason.empty() ? "error" : finish_reason}];
}

void Metrics::model_loaded(const std::string& model, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++loads_[model];
  load_seconds_.observe(seconds);
}

void Metrics::model_unloaded(const std::string& model) {
  std::lock_guard<std::mutex> lock(mu_);
  ++unloads_[model];
}

std::string Metrics::prometheus(const std::vector<ModelGauges>& models) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  header(out, "lmx_uptime_seconds", "gauge", "Seconds since the server started.");
  out += "lmx_uptime_seconds " +
         number(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()) +
         "\n";
  header(out, "lmx_http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, by_status] : requests_)
    for (const auto& [status, n] : by_status)
      out += "lmx_http_requests_total{method=\"" + label(key.first) + "\",route=\"" +
             label(key.second) + "\",status=\"" + std::to_string(status) + "\"} " +
             std::to_string(n) + "\n";
  header(out, "lmx_prompt_tokens_total", "counter",
         "Prompt tokens of finished generation requests (cached ones included).");
  for (const auto& [m, n] : prompt_tokens_)
    out += "lmx_prompt_tokens_total{model=\"" + label(m) + "\"} " + std::to_string(n) + "\n";
  header(out, "lmx_generation_tokens_total", "counter", "Tokens generated.");
  for (const auto& [m, n] : generated_tokens_)
    out += "lmx_generation_tokens_total{model=\"" + label(m) + "\"} " + std::to_string(n) + "\n";
  header(out, "lmx_requests_finished_total", "counter",
         "Generation requests finished, by model and finish reason.");
  for (const auto& [key, n] : finished_)
    out += "lmx_requests_finished_total{model=\"" + label(key.first) + "\",reason=\"" +
           label(key.second) + "\"} " + std::to_string(n) + "\n";
  write_histogram(out, "lmx_time_to_first_token_seconds",
                  "Seconds from a request's submission to its first token.", ttft_);
  write_histogram(out, "lmx_inter_token_latency_seconds",
                  "Seconds between two consecutive tokens of one request.", itl_);
  write_histogram(out, "lmx_model_load_seconds", "Seconds to load a model.", load_seconds_);
  header(out, "lmx_model_loads_total", "counter", "Models loaded.");
  for (const auto& [m, n] : loads_)
    out += "lmx_model_loads_total{model=\"" + label(m) + "\"} " + std::to_string(n) + "\n";
  header(out, "lmx_model_unloads_total", "counter", "Models unloaded to make room.");
  for (const auto& [m, n] : unloads_)
    out += "lmx_model_unloads_total{model=\"" + label(m) + "\"} " + std::to_string(n) + "\n";

  struct Gauge {
    const char* name;
    const char* type;
    const char* help;
    double (*get)(const SchedulerStats&);
  };
  static const Gauge gauges[] = {
      {"lmx_queue_depth", "gauge", "Requests waiting for a row.",
       [](const SchedulerStats& s) { return double(s.waiting); }},
      {"lmx_active_rows", "gauge", "Requests prefilling or decoding.",
       [](const SchedulerStats& s) { return double(s.active); }},
      {"lmx_decode_steps_total", "counter", "Batched decode steps run.",
       [](const SchedulerStats& s) { return double(s.steps); }},
      {"lmx_prompt_cache_hits_total", "counter", "Requests that reused a cached prompt prefix.",
       [](const SchedulerStats& s) { return double(s.prompt_cache_hits); }},
      {"lmx_prompt_cache_misses_total", "counter", "Requests that found no cached prefix.",
       [](const SchedulerStats& s) { return double(s.prompt_cache_misses); }},
      {"lmx_prompt_cache_reused_tokens_total", "counter", "Prompt tokens reused from the cache.",
       [](const SchedulerStats& s) { return double(s.cached_tokens); }},
      {"lmx_prompt_cache_entries", "gauge", "Entries in the prompt cache.",
       [](const SchedulerStats& s) { return double(s.prompt_cache_entries); }},
      {"lmx_prompt_cache_bytes", "gauge", "Bytes held by the prompt cache.",
       [](const SchedulerStats& s) { return double(s.prompt_cache_bytes); }},
      {"lmx_kv_cache_bytes", "gauge", "Bytes of the running requests' KV caches.",
       [](const SchedulerStats& s) { return double(s.kv_bytes); }},
  };
  header(out, "lmx_models_loaded", "gauge", "Models loaded now.");
  out += "lmx_models_loaded " + std::to_string(models.size()) + "\n";
  for (const Gauge& g : gauges) {
    header(out, g.name, g.type, g.help);
    for (const auto& m : models)
      out += std::string(g.name) + "{model=\"" + label(m.model) + "\"} " +
             number(g.get(m.scheduler)) + "\n";
  }
  return out;
}

ojson Metrics::json(const std::vector<ModelGauges>& models) const {
  std::lock_guard<std::mutex> lock(mu_);
  ojson requests = ojson::array();
  for (const auto& [key, by_status] : requests_)
    for (const auto& [status, n] : by_status)
      requests.push_back(
          {{"method", key.first}, {"route", key.second}, {"status", status}, {"count", n}});
  ojson per_model = ojson::array();
  for (const auto& m : models) {
    const SchedulerStats& s = m.scheduler;
    per_model.push_back({{"model", m.model},
                         {"queue_depth", s.waiting},
                         {"active_rows", s.active},
                         {"decode_steps", s.steps},
                         {"prompt_cache",
                          {{"hits", s.prompt_cache_hits},
                           {"misses", s.prompt_cache_misses},
                           {"reused_tokens", s.cached_tokens},
                           {"entries", s.prompt_cache_entries},
                           {"bytes", s.prompt_cache_bytes}}},
                         {"kv_cache_bytes", s.kv_bytes}});
  }
  ojson tokens = ojson::object();
  for (const auto& [m, n] : prompt_tokens_) tokens[m]["prompt"] = n;
  for (const auto& [m, n] : generated_tokens_) tokens[m]["generated"] = n;
  return {{"uptime_seconds",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()},
          {"requests", requests},
          {"tokens", tokens},
          {"time_to_first_token_seconds", histogram_json(ttft_)},
          {"inter_token_latency_seconds", histogram_json(itl_)},
          {"models", per_model}};
}

}  // namespace lmx::server
