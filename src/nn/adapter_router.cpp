#include "nn/adapter_router.h"

#include "core/error.h"

namespace lmx::nn {

namespace {

std::string names(const std::map<std::string, int>& by_name) {
  if (by_name.empty()) return "none";
  std::string out;
  for (const auto& [n, s] : by_name) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

int AdapterRouter::add_site(Site site) {
  sites_.push_back(std::move(site));
  return static_cast<int>(sites_.size()) - 1;
}

void AdapterRouter::add(Info info, Modules modules) {
  std::lock_guard<std::mutex> lock(mu_);
  check(!by_name_.count(info.name), "adapter", "an adapter named '", info.name,
        "' is already loaded, expected a new name (unload it first)");
  modules.linear.resize(sites_.size());
  modules.embedding.resize(sites_.size());
  info.serial = next_serial_++;
  const int slot = next_slot_++;
  by_name_[info.name] = slot;
  slots_[slot] = Slot{std::move(info), std::move(modules), 0};
}

void AdapterRouter::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  check(it != by_name_.end(), "adapter", "unknown adapter '", name,
        "', expected one of the loaded adapters: ", names(by_name_));
  const Slot& s = slots_.at(it->second);
  check(s.users == 0, "adapter", "adapter '", name, "' is in use by ", s.users,
        " running generation(s), expected none (retry when they finish)");
  slots_.erase(it->second);
  by_name_.erase(it);
}

std::vector<AdapterRouter::Info> AdapterRouter::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Info> out;
  for (const auto& [name, slot] : by_name_) out.push_back(slots_.at(slot).info);
  return out;
}

int AdapterRouter::acquire(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  check(it != by_name_.end(), "adapter", "unknown adapter '", name,
        "', expected one of the loaded adapters: ", names(by_name_));
  ++slots_.at(it->second).users;
  return it->second;
}

void AdapterRouter::release(int slot) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(slot);
  if (it != slots_.end() && it->second.users > 0) --it->second.users;
}

uint64_t AdapterRouter::serial(int slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.at(slot).info.serial;
}

std::string AdapterRouter::cache_key(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  check(it != by_name_.end(), "adapter", "unknown adapter '", name,
        "', expected one of the loaded adapters: ", names(by_name_));
  return name + "#" + std::to_string(slots_.at(it->second).info.serial);
}

bool AdapterRouter::has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_name_.count(name) > 0;
}

void AdapterRouter::route(const std::vector<int>& slot_per_row) {
  route_.clear();
  route_rows_ = static_cast<int>(slot_per_row.size());
  std::map<int, std::vector<bool>> rows;
  for (size_t b = 0; b < slot_per_row.size(); ++b) {
    const int s = slot_per_row[b];
    if (s < 0) continue;
    check(slots_.count(s) > 0, "adapter", "slot ", s, " is not loaded");
    auto& r = rows[s];
    r.resize(slot_per_row.size(), false);
    r[b] = true;
  }
  for (auto& [slot, r] : rows) {
    bool all = true;
    for (bool v : r) all = all && v;
    if (all) {
      route_.push_back({slot, std::nullopt});
      continue;
    }
    std::vector<uint8_t> bytes(r.begin(), r.end());
    route_.push_back({slot, mx::array(bytes.begin(), {static_cast<int>(bytes.size())}, mx::bool_)});
  }
}

bool AdapterRouter::applies(int site) const {
  for (const Route& r : route_) {
    const Modules& m = slots_.at(r.slot).modules;
    if (m.linear[site] || m.embedding[site]) return true;
  }
  return false;
}

template <typename F>
mx::array AdapterRouter::apply(const mx::array& y, int batch, F&& term) const {
  mx::array out = y;
  for (const Route& r : route_) {
    std::optional<mx::array> z = term(slots_.at(r.slot).modules);
    if (!z) continue;
    if (!r.rows) {
      out = *z;
      continue;
    }
    // Rows are the leading axis of every module output in a forward: (B, L, ...).
    check(batch == route_rows_, "adapter", "a module output with ", batch,
          " rows in a forward routed for ", route_rows_, " rows");
    mx::Shape shape(y.ndim(), 1);
    shape[0] = batch;
    out = mx::where(mx::reshape(*r.rows, shape), *z, out);
  }
  return out;
}

mx::array AdapterRouter::linear(int site, const mx::array& x, const mx::array& y) const {
  if (route_.empty()) return y;
  return apply(y, y.shape(0), [&](const Modules& m) -> std::optional<mx::array> {
    if (!m.linear[site]) return std::nullopt;
    return (*m.linear[site])(x, y);
  });
}

mx::array AdapterRouter::lookup(int site, const mx::array& ids, const mx::array& y) const {
  if (route_.empty()) return y;
  return apply(y, y.shape(0), [&](const Modules& m) -> std::optional<mx::array> {
    if (!m.embedding[site]) return std::nullopt;
    return m.embedding[site]->lookup(ids, y);
  });
}

mx::array AdapterRouter::head(int site, const mx::array& x, const mx::array& y) const {
  if (route_.empty()) return y;
  return apply(y, y.shape(0), [&](const Modules& m) -> std::optional<mx::array> {
    if (!m.embedding[site]) return std::nullopt;
    return m.embedding[site]->as_linear(x, y);
  });
}

}  // namespace lmx::nn
