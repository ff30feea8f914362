// jinja2's built-in filters, tests and globals, Python's str/dict/list methods and attribute and
// item lookup, as a chat template under transformers' ImmutableSandboxedEnvironment sees them.
#pragma once

#include <string>

#include "chat/value.h"

namespace lmx::chat {

// `obj.name`: methods of str/dict/list first, then dict entries (jinja2's Environment.getattr).
// A missing attribute is Undefined; any lookup on Undefined raises.
Value get_attr(const Value& obj, const std::string& name);
// `obj[key]`: dict entries and list/str indices first, then attributes (Environment.getitem).
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] with Python semantics (null members: omitted).
Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step);

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args);
bool apply_test(const std::string& name, const Value& v, const CallArgs& args);
bool has_filter(const std::string& name);
// Python's `x in container` (substring, list member or dict key).
bool value_in(const Value& x, const Value& container);
bool has_test(const std::string& name);

// range, namespace, dict, raise_exception, strftime_now, cycler, joiner.
Value global(const std::string& name);

// Python's `a % b` on strings (printf-style formatting), used by the `%` operator and `format`.
std::string percent_format(const std::string& fmt, const Value& args);

// `s.name(args)` for Python's str methods (strip, split, startswith, format, ...).
bool is_str_method(const std::string& name);
Value str_method(const std::string& s, const std::string& name, const CallArgs& args);

// Python str methods on code points and with Python's whitespace set.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_title(const std::string& s);
std::string py_capitalize(const std::string& s);

// The `x.a.b` / `x.0` attribute path that filters' `attribute=` arguments take.
Value attribute_path(const Value& v, const std::string& path);

}  // namespace lmx::chat
