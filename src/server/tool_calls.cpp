#include "server/tool_calls.h"

#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>

namespace lmx::server {

using ojson = nlohmann::ordered_json;

ToolFormat detect_tool_format(const std::string& src) {
  if (src.find("<|channel|>") != std::string::npos) return ToolFormat::kHarmony;
  if (src.find("<|tool_call>") != std::string::npos) return ToolFormat::kGemma4;
  if (src.find("<start_function_call>") != std::string::npos) return ToolFormat::kGemma;
  if (src.find("[TOOL_CALLS]") != std::string::npos) return ToolFormat::kMistral;
  if (src.find("<tool_call>") != std::string::npos) return ToolFormat::kHermes;
  if (src.find("<|python_tag|>") != std::string::npos || src.find("ipython") != std::string::npos)
    return ToolFormat::kLlama3;
  // Templates that render `tools` without naming a format: Hermes is mlx_lm's json_tools default.
  if (src.find("tools") != std::string::npos) return ToolFormat::kHermes;
  return ToolFormat::kNone;
}

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3:
      return "llama3";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kGemma:
      return "gemma";
    case ToolFormat::kGemma4:
      return "gemma4";
    case ToolFormat::kHarmony:
      return "harmony";
    default:
      return "none";
  }
}

OutputSplitter::Markers output_markers(ToolFormat f) {
  OutputSplitter::Markers m;
  switch (f) {
    case ToolFormat::kHermes:
      m.tool_start = "<tool_call>", m.tool_end = "</tool_call>";
      break;
    case ToolFormat::kLlama3:
      m.tool_start = "<|python_tag|>";
      break;
    case ToolFormat::kMistral:
      m.tool_start = "[TOOL_CALLS]";
      break;
    case ToolFormat::kGemma:
      m.tool_start = "<start_function_call>", m.tool_end = "<end_function_call>";
      break;
    case ToolFormat::kGemma4:
      m.tool_start = "<|tool_call>", m.tool_end = "<tool_call|>";
      break;
    case ToolFormat::kHarmony:
      // <|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final<|message|>C
      m.think_start = "<|channel|>analysis<|message|>", m.think_end = "<|end|>";
      m.drop = {"<|start|>assistant", "<|channel|>final<|message|>"};
      break;
    default:
      break;
  }
  return m;
}

namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::optional<ojson> parse_json(const std::string& s) {
  ojson j = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// {"name": str, "arguments"|"parameters": object or JSON string of one}.
std::optional<ToolCall> call_from_object(const ojson& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ojson args = ojson::object();
  for (const char* key : {"arguments", "parameters"}) {
    if (!j.contains(key)) continue;
    args = j[key];
    if (args.is_string()) {
      auto parsed = parse_json(args.get<std::string>());
      if (!parsed) return std::nullopt;
      args = *parsed;
    }
    break;
  }
  if (!args.is_object()) return std::nullopt;
  ToolCall c{"", j["name"].get<std::string>(), args.dump()};
  if (j.contains("id") && j["id"].is_string()) c.id = j["id"].get<std::string>();
  return c;
}

std::vector<ToolCall> calls_from_json(const std::string& text) {
  auto j = parse_json(trim(text));
  if (!j) return {};
  std::vector<ToolCall> out;
  for (const ojson& item : j->is_array() ? *j : ojson::array({*j})) {
    auto c = call_from_object(item);
    if (!c) return {};
    out.push_back(std::move(*c));
  }
  return out;
}

// Mistral v11+: name[ARGS]{json} repeated.
std::vector<ToolCall> mistral_headers(const std::string& text) {
  std::vector<ToolCall> out;
  size_t pos = 0;
  while (true) {
    const size_t args = text.find("[ARGS]", pos);
    if (args == std::string::npos) break;
    std::string name = trim(text.substr(pos, args - pos));
    size_t next = text.find("[ARGS]", args + 6);
    // The arguments run to the start of the next call's name.
    size_t end = text.size();
    if (next != std::string::npos) {
      end = text.rfind('}', next);
      end = end == std::string::npos ? next : end + 1;
    }
    auto j = parse_json(trim(text.substr(args + 6, end - args - 6)));
    if (name.empty() || !j || !j->is_object()) return {};
    out.push_back(ToolCall{"", name, j->dump()});
    pos = end;
  }
  return out;
}

// Gemma's call:name{key:value,...}: unquoted keys, strings between `escape` markers, other
// values JSON (numbers, booleans, arrays) or bare text.
std::vector<ToolCall> gemma_calls(const std::string& text, const std::string& escape) {
  std::vector<ToolCall> out;
  size_t pos = 0;
  while ((pos = text.find("call:", pos)) != std::string::npos) {
    size_t p = pos + 5, name_end = p;
    while (name_end < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[name_end])) || text[name_end] == '_' ||
            text[name_end] == '-' || text[name_end] == '.'))
      ++name_end;
    if (name_end == p || name_end >= text.size() || text[name_end] != '{') return {};
    ToolCall call{"", text.substr(p, name_end - p), ""};
    ojson args = ojson::object();
    p = name_end + 1;
    while (p < text.size() && text[p] != '}') {
      const size_t colon = text.find(':', p);
      if (colon == std::string::npos) return {};
      const std::string key = trim(text.substr(p, colon - p));
      p = colon + 1;
      if (text.compare(p, escape.size(), escape) == 0) {
        const size_t close = text.find(escape, p + escape.size());
        if (close == std::string::npos) return {};
        args[key] = text.substr(p + escape.size(), close - p - escape.size());
        p = close + escape.size();
      } else {
        int depth = 0;
        size_t q = p;
        for (; q < text.size(); ++q) {
          const char c = text[q];
          if (c == '[' || c == '{') ++depth;
          if ((c == ']' || c == '}') && depth > 0)
            --depth;
          else if (depth == 0 && (c == ',' || c == '}'))
            break;
        }
        const std::string raw = trim(text.substr(p, q - p));
        auto v = parse_json(raw);
        args[key] = v ? *v : ojson(raw);
        p = q;
      }
      if (p < text.size() && text[p] == ',') ++p;
    }
    if (p >= text.size()) return {};
    // The values are raw model text, which need not be valid UTF-8: invalid bytes become U+FFFD
    // instead of a json type_error.
    call.arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
    out.push_back(std::move(call));
    pos = p + 1;
  }
  return out;
}

}  // namespace

std::vector<ToolCall> parse_bare_json_call(const std::string& text) {
  auto j = parse_json(trim(text));
  if (!j || !j->is_object()) return {};
  auto c = call_from_object(*j);
  if (!c) return {};
  return {*c};
}

std::vector<ToolCall> parse_tool_block(ToolFormat f, const std::string& block) {
  switch (f) {
    case ToolFormat::kHermes:
    case ToolFormat::kLlama3:
      return calls_from_json(block);
    case ToolFormat::kMistral: {
      auto calls = calls_from_json(block);
      return calls.empty() ? mistral_headers(block) : calls;
    }
    case ToolFormat::kGemma:
      return gemma_calls(block, "<escape>");
    case ToolFormat::kGemma4:
      return gemma_calls(block, "<|\"|>");
    default:
      return {};
  }
}

}  // namespace lmx::server
