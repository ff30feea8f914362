// The server's counters for GET /metrics (Prometheus text format 0.0.4) and GET /stats (JSON):
// requests by route and status, tokens, time to first token and inter-token latency histograms,
// and each loaded model's scheduler (queue depth, active rows, prompt cache, KV bytes).
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lmx/lmx.h"
#include "server/requests.h"

namespace lmx::server {

struct Histogram {
  std::vector<double> bounds;    // upper bounds, ascending; +Inf is implied
  std::vector<uint64_t> counts;  // one per bound and +Inf; not cumulative
  double sum = 0;
  uint64_t total = 0;
  void observe(double v);
};

// A loaded model's part of the metrics, read at scrape time.
struct ModelGauges {
  std::string model;
  SchedulerStats scheduler;
};

class Metrics {
 public:
  Metrics();
  // One answered HTTP request; `route` is the route's pattern (ids cut out), so the label set
  // stays bounded.
  void request(const std::string& method, const std::string& route, int status);
  void first_token(double seconds);  // from submission to the first token
  void next_token(double seconds);   // between two tokens of one request
  void finished(const std::string& model, int prompt_tokens, int generated_tokens,
                const std::string& finish_reason);
  void model_loaded(const std::string& model, double seconds);
  void model_unloaded(const std::string& model);

  std::string prometheus(const std::vector<ModelGauges>& models) const;
  ojson json(const std::vector<ModelGauges>& models) const;

  // The pattern of a path among the server's routes ("/v1/adapters/{id}"); "other" for the rest.
  static std::string route_of(const std::string& path);

 private:
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::map<std::pair<std::string, std::string>, std::map<int, uint64_t>> requests_;
  std::map<std::string, uint64_t> prompt_tokens_, generated_tokens_;
  std::map<std::pair<std::string, std::string>, uint64_t> finished_;  // (model, reason)
  std::map<std::string, uint64_t> loads_, unloads_;
  Histogram ttft_, itl_, load_seconds_;
};

}  // namespace lmx::server
