// Argument access shared by the filter tables (filters.cpp, filters_text.cpp).
#pragma once

#include <map>
#include <string>

#include "chat/value.h"

namespace lmx::chat::filter_detail {

using Filter = Value (*)(const Value&, const CallArgs&);

inline const Value* arg(const CallArgs& a, size_t i, const char* name) { return a.get(i, name); }
inline bool flag(const CallArgs& a, size_t i, const char* name, bool fallback = false) {
  const Value* v = a.get(i, name);
  return v ? truthy(*v) : fallback;
}
inline std::string str_arg(const CallArgs& a, size_t i, const char* name,
                           const std::string& fallback) {
  const Value* v = a.get(i, name);
  return v && !v->is_none() ? to_str(*v) : fallback;
}

// Filters that run str methods on soft_str(value) return Markup for Markup input.
inline Value keep_markup(const Value& in, std::string out) {
  Value v = Value::string(std::move(out));
  v.markup = in.markup;
  return v;
}

// jinja2's string and number filters (filters_text.cpp).
const std::map<std::string, Filter>& text_filters();

}  // namespace lmx::chat::filter_detail
