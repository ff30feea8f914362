#include "server/tool_calls.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

namespace lmx::server {

using ojson = nlohmann::ordered_json;

ToolFormat detect_tool_format(const std::string& src) {
  if (src.find("<|channel|>") != std::string::npos) return ToolFormat::kHarmony;
  if (src.find("<|tool_call>") != std::string::npos) return ToolFormat::kGemma4;
  if (src.find("<start_function_call>") != std::string::npos) return ToolFormat::kGemma;
  if (src.find("[TOOL_CALLS]") != std::string::npos) return ToolFormat::kMistral;
  // mlx_lm's _infer_tool_parser: the template writes `<tool_call>` then a newline (escaped in a
  // Jinja string literal, or raw) then `<function=`; Hermes' JSON blocks never do.
  if (src.find("<tool_call>\\n<function=") != std::string::npos ||
      src.find("<tool_call>\n<function=") != std::string::npos)
    return ToolFormat::kQwen3Coder;
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
    case ToolFormat::kQwen3Coder:
      return "qwen3_coder";
    default:
      return "none";
  }
}

OutputSplitter::Markers output_markers(ToolFormat f) {
  OutputSplitter::Markers m;
  switch (f) {
    case ToolFormat::kHermes:
    case ToolFormat::kQwen3Coder:
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
      // A call: <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json
      // <|message|>{...}<|call|>, or with ` to=functions.f` in the role header before
      // <|channel|>. <|call|> is an EOS token of gpt-oss (generation_config.json), so the block
      // usually runs to the end of the output. A commentary message without a recipient (a
      // preamble to the user) is content.
      m.think_start = "<|channel|>analysis<|message|>", m.think_end = "<|end|>";
      m.tool_start = "<|channel|>commentary to=", m.tool_end = "<|call|>";
      m.more_tool_starts = {"<|channel|>analysis to=", " to=functions."};
      m.block_keeps_start = true;
      m.drop = {"<|start|>assistant", "<|channel|>final<|message|>",
                "<|channel|>commentary<|message|>", "<|end|>"};
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

// The value of a Python literal (ast.literal_eval's grammar, less bytes, sets, complex numbers,
// raw and implicitly joined strings) as JSON the way json.dumps writes it; nullopt where Python
// would raise.
class PyLiteral {
 public:
  explicit PyLiteral(const std::string& s) : s_(s) {}
  std::optional<ojson> parse() {
    // literal_eval strips leading spaces and tabs; eval mode takes newlines around the value.
    skip_space();
    auto v = value(0);
    skip_space();
    if (!v || p_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip_space() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r'))
      ++p_;
  }
  bool eat(char c) {
    skip_space();
    if (p_ < s_.size() && s_[p_] == c) return ++p_, true;
    return false;
  }
  bool word(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(p_, n, w) != 0) return false;
    if (p_ + n < s_.size() &&
        (std::isalnum(static_cast<unsigned char>(s_[p_ + n])) || s_[p_ + n] == '_'))
      return false;
    p_ += n;
    return true;
  }
  std::optional<ojson> value(int depth) {
    if (depth > 64) return std::nullopt;
    skip_space();
    if (p_ >= s_.size()) return std::nullopt;
    const char c = s_[p_];
    if (c == '\'' || c == '"') return string();
    if (c == '[' || c == '(') return sequence(depth, c == '[' ? ']' : ')');
    if (c == '{') return dict(depth);
    if (word("True")) return ojson(true);
    if (word("False")) return ojson(false);
    if (word("None")) return ojson(nullptr);
    return number();
  }
  std::optional<ojson> number() {
    size_t q = p_;
    if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) ++q;
    const size_t digits = q;
    while (q < s_.size() &&
           (std::isdigit(static_cast<unsigned char>(s_[q])) || s_[q] == '.' || s_[q] == 'e' ||
            s_[q] == 'E' ||
            ((s_[q] == '-' || s_[q] == '+') && (s_[q - 1] == 'e' || s_[q - 1] == 'E'))))
      ++q;
    if (q == digits) return std::nullopt;
    std::string t = s_.substr(p_, q - p_);
    if (t[0] == '+') t.erase(0, 1);
    // Python takes 5. and .5; JSON wants a digit on both sides of the point.
    const size_t dot = t.find('.');
    if (dot != std::string::npos) {
      if (dot + 1 == t.size() || !std::isdigit(static_cast<unsigned char>(t[dot + 1])))
        t.insert(dot + 1, "0");
      if (dot == 0 || !std::isdigit(static_cast<unsigned char>(t[dot - 1]))) t.insert(dot, "0");
    }
    const bool is_float = t.find_first_of(".eE") != std::string::npos;
    // A leading zero is a Python syntax error (0 alone aside).
    const size_t lead = t[0] == '-' ? 1 : 0;
    if (!is_float && t.size() > lead + 1 && t[lead] == '0') return std::nullopt;
    auto j = parse_json(t);
    if (!j || !j->is_number()) return std::nullopt;
    p_ = q;
    // json.dumps writes a float with its point (5.0), an int without.
    if (is_float && !j->is_number_float()) return ojson(j->get<double>());
    return j;
  }
  std::optional<ojson> string() {
    const char quote = s_[p_++];
    std::string out;
    while (p_ < s_.size() && s_[p_] != quote) {
      char c = s_[p_++];
      if (c == '\n') return std::nullopt;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= s_.size()) return std::nullopt;
      c = s_[p_++];
      switch (c) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'a':
          out += '\a';
          break;
        case '0':
          out += '\0';
          break;
        case '\\':
        case '\'':
        case '"':
          out += c;
          break;
        case '\n':
          break;  // a line continuation
        default:
          out += '\\', out += c;  // Python keeps an unknown escape as written
      }
    }
    if (p_ >= s_.size()) return std::nullopt;
    ++p_;
    return ojson(out);
  }
  std::optional<ojson> sequence(int depth, char close) {
    ++p_;
    ojson out = ojson::array();
    bool comma = false;
    while (!eat(close)) {
      if (!out.empty() && !comma) return std::nullopt;
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      out.push_back(std::move(*v));
      comma = eat(',');
    }
    // (x) is x itself, (x,) a tuple.
    if (close == ')' && out.size() == 1 && !comma) return out[0];
    return out;
  }
  std::optional<ojson> dict(int depth) {
    ++p_;
    ojson out = ojson::object();
    bool comma = false;
    while (!eat('}')) {
      if (!out.empty() && !comma) return std::nullopt;
      auto k = value(depth + 1);
      if (!k || !eat(':')) return std::nullopt;
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      // json.dumps turns str, int, float, bool and None keys into strings.
      std::string key;
      if (k->is_string())
        key = k->get<std::string>();
      else if (k->is_primitive())
        key = k->dump();
      else
        return std::nullopt;
      out[key] = std::move(*v);
      comma = eat(',');
    }
    return out;
  }
  const std::string& s_;
  size_t p_ = 0;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Python's float(): surrounding whitespace, an optional sign, decimal digits; inf and nan are
// rejected (int() of them raises in mlx_lm's parser).
std::optional<double> py_float(const std::string& text) {
  const std::string t = trim(text);
  if (t.empty() || t.find_first_of("xXpP_") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

ojson integral(double v) {
  if (std::fabs(v) < 9.2e18) return ojson(static_cast<int64_t>(v));
  return ojson(v);
}

// mlx_lm.tool_parsers.qwen3_coder._convert_param_value: the value typed by its schema entry.
std::optional<ojson> qwen_param_value(const std::string& value, const ojson& schema) {
  if (lower(value) == "null") return ojson(nullptr);
  if (!schema.is_object() || schema.empty()) return ojson(value);
  if (!schema.contains("type")) {
    auto j = parse_json(value);
    return j && j->is_structured() ? *j : ojson(value);
  }
  // A type that is not a string (a list of types) matches none of the names below.
  const std::string type =
      schema["type"].is_string() ? lower(trim(schema["type"].get<std::string>())) : "";
  auto starts = [&](const char* p) { return type.rfind(p, 0) == 0; };
  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" ||
      type == "enum")
    return ojson(value);
  if (starts("int") || starts("uint") || starts("long") || starts("short") || starts("unsigned")) {
    auto v = py_float(value);
    if (!v || *v != std::trunc(*v)) return std::nullopt;
    return integral(*v);
  }
  if (starts("num") || starts("float")) {
    auto v = py_float(value);
    if (!v) return std::nullopt;
    return *v != std::trunc(*v) ? ojson(*v) : integral(*v);
  }
  if (type == "boolean" || type == "bool" || type == "binary") return ojson(lower(value) == "true");
  if (type == "object" || type == "array" || type == "arr" || starts("dict") || starts("list")) {
    if (auto j = parse_json(value)) return *j;
  }
  if (auto v = PyLiteral(value).parse()) return *v;
  return ojson(value);
}

// mlx_lm's _name_regex `\s*([^\s<>]+)>?` at `p`; moves `p` past the match.
std::optional<std::string> xml_name(const std::string& t, size_t& p) {
  while (p < t.size() && std::isspace(static_cast<unsigned char>(t[p]))) ++p;
  size_t q = p;
  while (q < t.size() && !std::isspace(static_cast<unsigned char>(t[q])) && t[q] != '<' &&
         t[q] != '>')
    ++q;
  if (q == p) return std::nullopt;
  std::string name = t.substr(p, q - p);
  p = q < t.size() && t[q] == '>' ? q + 1 : q;
  return name;
}

// The `properties` of the named function's parameters among the request's tools.
ojson tool_properties(const ojson& tools, const std::string& name) {
  if (!tools.is_array()) return ojson::object();
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const ojson& f = t["function"];
    if (!f.contains("name") || f["name"] != name) continue;
    if (!f.contains("parameters") || !f["parameters"].is_object() ||
        !f["parameters"].contains("properties"))
      return ojson::object();
    return f["parameters"]["properties"];
  }
  return ojson::object();
}

// Qwen3-Coder / Qwen3.5: <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...</function>.
// Like mlx_lm, the block must end with </function> (whitespace after it aside) and a value loses
// one newline on each side. Unlike mlx_lm, which reads one function from the first <function= to
// the last </function>, every function element of the block is its own call (as Qwen's own
// qwen3coder_tool_parser does).
std::vector<ToolCall> qwen3_coder_calls(const std::string& text, const ojson& tools) {
  static const std::string kOpen = "<function=", kClose = "</function>",
                           kPOpen = "<parameter=", kPClose = "</parameter>";
  if (trim(text).size() < kClose.size() ||
      trim(text).compare(trim(text).size() - kClose.size(), kClose.size(), kClose) != 0)
    return {};
  std::vector<ToolCall> out;
  size_t pos = 0;
  while ((pos = text.find(kOpen, pos)) != std::string::npos) {
    const size_t end = text.find(kClose, pos);
    if (end == std::string::npos) return {};
    const std::string body = text.substr(pos + kOpen.size(), end - pos - kOpen.size());
    pos = end + kClose.size();
    size_t p = 0;
    auto name = xml_name(body, p);
    if (!name) return {};
    const ojson props = tool_properties(tools, *name);
    ojson args = ojson::object();
    while ((p = body.find(kPOpen, p)) != std::string::npos) {
      const size_t close = body.find(kPClose, p);
      if (close == std::string::npos) break;
      const std::string item = body.substr(p + kPOpen.size(), close - p - kPOpen.size());
      p = close + kPClose.size();
      size_t q = 0;
      auto key = xml_name(item, q);
      if (!key) continue;
      std::string value = item.substr(q);
      if (!value.empty() && value.front() == '\n') value.erase(0, 1);
      if (!value.empty() && value.back() == '\n') value.pop_back();
      auto v = qwen_param_value(value, props.contains(*key) ? props[*key] : ojson());
      if (!v) return {};
      args[*key] = std::move(*v);
    }
    out.push_back(ToolCall{"", *name, args.dump(-1, ' ', false, ojson::error_handler_t::replace)});
  }
  return out;
}

// gpt-oss: a header naming the recipient `to=functions.NAME`, then <|message|> and the JSON
// arguments, up to <|call|> where the output still has it.
std::vector<ToolCall> harmony_call(const std::string& block) {
  static const std::string kMessage = "<|message|>", kFunctions = "functions.";
  const size_t msg = block.find(kMessage);
  if (msg == std::string::npos) return {};
  const std::string header = block.substr(0, msg);
  const size_t to = header.find("to=");
  if (to == std::string::npos) return {};
  size_t q = to + 3;
  while (q < header.size() && !std::isspace(static_cast<unsigned char>(header[q])) &&
         header.compare(q, 2, "<|") != 0)
    ++q;
  const std::string recipient = header.substr(to + 3, q - to - 3);
  // Built-in tools (browser.*, python) are not the client's functions.
  if (recipient.rfind(kFunctions, 0) != 0 || recipient.size() == kFunctions.size()) return {};
  std::string args = block.substr(msg + kMessage.size());
  args = args.substr(0, args.find("<|call|>"));
  auto j = parse_json(trim(args));
  if (!j || !j->is_object()) return {};
  return {ToolCall{"", recipient.substr(kFunctions.size()), j->dump()}};
}

}  // namespace

std::vector<ToolCall> parse_bare_json_call(const std::string& text) {
  auto j = parse_json(trim(text));
  if (!j || !j->is_object()) return {};
  auto c = call_from_object(*j);
  if (!c) return {};
  return {*c};
}

std::vector<ToolCall> parse_tool_block(ToolFormat f, const std::string& block, const ojson& tools) {
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
    case ToolFormat::kQwen3Coder:
      return qwen3_coder_calls(block, tools);
    case ToolFormat::kHarmony:
      return harmony_call(block);
    default:
      return {};
  }
}

}  // namespace lmx::server
