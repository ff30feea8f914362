#include "server/requests.h"

#include <limits>

#include "server/api_error.h"

namespace lmx::server {

namespace {

std::optional<double> number(const ojson& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_number()) bad_field(key, "must be a number, got " + b[key].dump());
  return b[key].get<double>();
}

std::optional<int> integer(const ojson& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_number_integer()) bad_field(key, "must be an integer, got " + b[key].dump());
  return b[key].get<int>();
}

std::optional<bool> boolean(const ojson& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_boolean()) bad_field(key, "must be a boolean, got " + b[key].dump());
  return b[key].get<bool>();
}

std::optional<std::string> string(const ojson& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_string()) bad_field(key, "must be a string, got " + b[key].dump());
  return b[key].get<std::string>();
}

std::vector<std::string> string_list(const ojson& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return {};
  if (b[key].is_string()) return {b[key].get<std::string>()};
  if (!b[key].is_array()) bad_field(key, "must be a string or a list of strings");
  std::vector<std::string> out;
  for (const auto& s : b[key]) {
    if (!s.is_string()) bad_field(key, "must be a string or a list of strings");
    out.push_back(s.get<std::string>());
  }
  return out;
}

// An integer token id; past int's range it is out of any vocabulary (not wrapped into one).
int token_id(const ojson& t, const std::string& field) {
  const long long id = t.get<long long>();
  if (id < 0 || id > std::numeric_limits<int>::max())
    bad_field(field, "has token id " + t.dump() + " outside the vocabulary");
  return static_cast<int>(id);
}

// OpenAI's {type: text} | {type: json_object} | {type: json_schema, json_schema: {name, schema,
// strict}}; the schema is compiled when the job is made (make_job).
void response_format(const ojson& b, SamplingRequest& s) {
  if (!b.contains("response_format") || b["response_format"].is_null()) return;
  const ojson& rf = b["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad_field("response_format", "must be {type: text | json_object | json_schema}");
  const std::string type = rf["type"].get<std::string>();
  if (type == "json_object") {
    s.json_object = true;
  } else if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
      bad_field("response_format.json_schema", "must be an object {name, schema, strict}");
    const ojson& js = rf["json_schema"];
    if (!js.contains("schema") || !(js["schema"].is_object() || js["schema"].is_boolean()))
      bad_field("response_format.json_schema.schema", "must be a JSON schema object");
    s.json_schema = js["schema"];
  } else if (type != "text") {
    bad_field("response_format.type", "must be text, json_object or json_schema, got " + type);
  }
}

// The fields OpenAI's chat and completions endpoints share.
SamplingRequest sampling(const ojson& b, const SamplingDefaults& d, const char* max_key) {
  SamplingRequest s;
  s.model = string(b, "model").value_or("default_model");
  s.adapter = string(b, "adapter").value_or("");
  s.adapter_path = string(b, "adapters");
  s.speculative = boolean(b, "speculative");
  s.num_draft_tokens = integer(b, "num_draft_tokens");
  if (s.num_draft_tokens && *s.num_draft_tokens < 1) bad_field("num_draft_tokens", "must be >= 1");
  GenerateOptions& g = s.gen;
  g.prefill_step_size = d.prefill_step_size;
  g.kv_bits = d.kv_bits;
  g.kv_group_size = d.kv_group_size;
  g.quantized_kv_start = d.quantized_kv_start;
  const char* max_field = max_key;
  std::optional<int> max = integer(b, max_key);
  if (!max) max = integer(b, max_field = "max_tokens");
  g.max_tokens = max.value_or(d.max_tokens);
  if (g.max_tokens < 0) bad_field(max_field, "must be >= 0");
  g.sampler.temp = static_cast<float>(number(b, "temperature").value_or(d.temp));
  if (g.sampler.temp < 0) bad_field("temperature", "must be >= 0");
  g.sampler.top_p = static_cast<float>(number(b, "top_p").value_or(d.top_p));
  if (g.sampler.top_p <= 0 || g.sampler.top_p > 1) bad_field("top_p", "must be in (0, 1]");
  g.sampler.top_k = integer(b, "top_k").value_or(d.top_k);
  if (g.sampler.top_k < 0) bad_field("top_k", "must be >= 0");
  g.sampler.min_p = static_cast<float>(number(b, "min_p").value_or(d.min_p));
  if (g.sampler.min_p < 0 || g.sampler.min_p > 1) bad_field("min_p", "must be in [0, 1]");
  if (auto seed = integer(b, "seed")) g.seed = static_cast<uint64_t>(*seed);
  auto& p = g.processors;
  if (auto v = number(b, "repetition_penalty")) {
    if (*v < 0) bad_field("repetition_penalty", "must be >= 0");
    p.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = integer(b, "repetition_context_size")) {
    if (*v <= 0) bad_field("repetition_context_size", "must be > 0");
    p.repetition_context_size = *v;
  }
  if (auto v = number(b, "presence_penalty")) p.presence_penalty = static_cast<float>(*v);
  if (auto v = number(b, "frequency_penalty")) p.frequency_penalty = static_cast<float>(*v);
  if (b.contains("logit_bias") && !b["logit_bias"].is_null()) {
    if (!b["logit_bias"].is_object()) bad_field("logit_bias", "must be an object {token id: bias}");
    for (const auto& [k, v] : b["logit_bias"].items()) {
      size_t used = 0;
      int id = -1;
      try {
        id = std::stoi(k, &used);
      } catch (const std::exception&) {
      }
      if (used != k.size() || id < 0 || !v.is_number())
        bad_field("logit_bias", "must map token ids to numbers, got " + k + ": " + v.dump());
      p.logit_bias.emplace_back(id, v.get<float>());
    }
  }
  // vLLM's extension; benchmarks use it to always generate max_tokens.
  g.ignore_eos = boolean(b, "ignore_eos").value_or(false);
  s.stop = string_list(b, "stop");
  response_format(b, s);
  s.stream = boolean(b, "stream").value_or(false);
  if (b.contains("stream_options") && b["stream_options"].is_object())
    s.include_usage = boolean(b["stream_options"], "include_usage").value_or(false);
  return s;
}

// chat_template_kwargs (mlx_lm.server's extension, also taken on /v1/messages).
ojson template_kwargs(const ojson& b) {
  if (!b.contains("chat_template_kwargs") || b["chat_template_kwargs"].is_null())
    return ojson::object();
  if (!b["chat_template_kwargs"].is_object())
    bad_field("chat_template_kwargs", "must be an object");
  return b["chat_template_kwargs"];
}

// What mlx_lm.server hands the template: content parts joined into one string, null content
// as "", tool-call arguments given as a JSON string parsed into an object.
void normalize_messages(ojson& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    ojson& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.contains("content") || m["content"].is_null()) {
      m["content"] = "";
    } else if (m["content"].is_array()) {
      std::string text;
      for (const auto& part : m["content"]) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad_field(at + ".content", "only text content parts are supported");
        text += part["text"].get<std::string>();
      }
      m["content"] = text;
    }
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (auto& tc : m["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
          bad_field(at + ".tool_calls", "each tool call needs a function object");
        ojson& f = tc["function"];
        if (f.contains("arguments") && f["arguments"].is_string()) {
          ojson args = ojson::parse(f["arguments"].get<std::string>(), nullptr, false);
          if (args.is_discarded())
            bad_field(at + ".tool_calls", "function.arguments is not valid JSON");
          f["arguments"] = args;
        }
      }
    }
  }
}

// A forced tool_choice needs tools, and a named function one of them.
void check_tool_choice(const ChatRequest& r) {
  if (r.tool_choice != "required" && r.tool_choice != "function") return;
  if (!r.tools) bad_field("tool_choice", r.tool_choice + " needs a non-empty list of tools");
  if (r.tool_choice != "function") return;
  for (const auto& t : *r.tools)
    if (t["function"]["name"] == r.tool_name) return;
  bad_field("tool_choice", "names function '" + r.tool_name + "', which is not among the tools");
}

}  // namespace

ojson parse_body(const std::string& body) {
  ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

ChatRequest parse_chat_request(const ojson& b, const SamplingDefaults& d) {
  ChatRequest r;
  r.s = sampling(b, d, "max_completion_tokens");
  if (!b.contains("messages") || !b["messages"].is_array() || b["messages"].empty())
    bad_field("messages", "must be a non-empty list of messages");
  for (size_t i = 0; i < b["messages"].size(); ++i) {
    const ojson& m = b["messages"][i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad_field(at + ".role", "is required and must be a string");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer")
      bad_field(at + ".role", "must be system, developer, user, assistant or tool, got " + role);
    if (m.contains("content") && !m["content"].is_null() && !m["content"].is_string() &&
        !m["content"].is_array())
      bad_field(at + ".content", "must be a string or a list of content parts");
  }
  r.messages = b["messages"];
  normalize_messages(r.messages);
  if (b.contains("tools") && !b["tools"].is_null()) {
    if (!b["tools"].is_array()) bad_field("tools", "must be a list of tools");
    for (const auto& t : b["tools"])
      if (!t.is_object() || !t.contains("function") || !t["function"].contains("name"))
        bad_field("tools", "each tool must be {type: function, function: {name, ...}}");
    if (!b["tools"].empty()) r.tools = b["tools"];
  }
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const ojson& tc = b["tool_choice"];
    if (tc.is_string()) {
      r.tool_choice = tc.get<std::string>();
      if (r.tool_choice != "auto" && r.tool_choice != "none" && r.tool_choice != "required")
        bad_field("tool_choice", "must be auto, none, required or {type: function, ...}");
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      r.tool_choice = "function";
      r.tool_name = tc["function"]["name"].get<std::string>();
    } else {
      bad_field("tool_choice",
                "must be auto, none, required or {type: function, function: {name}}");
    }
  }
  r.parallel_tool_calls = boolean(b, "parallel_tool_calls").value_or(true);
  check_tool_choice(r);
  r.template_kwargs = template_kwargs(b);
  if (auto effort = string(b, "reasoning_effort")) {
    if (*effort != "none" && *effort != "minimal" && *effort != "low" && *effort != "medium" &&
        *effort != "high")
      bad_field("reasoning_effort", "must be none, minimal, low, medium or high");
    if (!r.template_kwargs.contains("enable_thinking"))
      r.template_kwargs["enable_thinking"] = *effort != "none";
    r.template_kwargs["reasoning_effort"] = *effort;
  }
  if (boolean(b, "logprobs").value_or(false)) {
    r.s.top_logprobs = integer(b, "top_logprobs").value_or(0);
    if (r.s.top_logprobs < 0 || r.s.top_logprobs > 20) bad_field("top_logprobs", "must be 0-20");
  } else if (integer(b, "top_logprobs")) {
    bad_field("top_logprobs", "needs logprobs: true");
  }
  if (auto n = integer(b, "n"); n && *n != 1) bad_field("n", "only n = 1 is supported");
  return r;
}

CompletionRequest parse_completion_request(const ojson& b, const SamplingDefaults& d) {
  CompletionRequest r;
  r.s = sampling(b, d, "max_tokens");
  if (!b.contains("prompt")) bad_field("prompt", "is required");
  const ojson& p = b["prompt"];
  if (p.is_string()) {
    r.prompt = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (const auto& t : p) {
      if (!t.is_number_integer()) bad_field("prompt", "a token list must hold integers only");
      r.prompt_tokens.push_back(token_id(t, "prompt"));
    }
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r.prompt = p[0].get<std::string>();
  } else {
    bad_field("prompt", "must be a string or a list of token ids");
  }
  if (auto lp = integer(b, "logprobs")) {
    if (*lp < 0 || *lp > 20) bad_field("logprobs", "must be 0-20");
    r.s.top_logprobs = *lp;
  }
  r.echo = boolean(b, "echo").value_or(false);
  if (auto n = integer(b, "n"); n && *n != 1) bad_field("n", "only n = 1 is supported");
  return r;
}

namespace {

// Anthropic content: a string or blocks; text blocks joined.
std::string anthropic_text(const ojson& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(field, "must be a string or a list of content blocks");
  std::string out;
  for (const auto& blk : content) {
    if (!blk.is_object() || !blk.contains("type"))
      bad_field(field, "each content block needs a type");
    if (blk["type"] == "text") {
      if (!blk.contains("text") || !blk["text"].is_string())
        bad_field(field, "a text block needs a string text");
      out += blk["text"].get<std::string>();
    }
  }
  return out;
}

}  // namespace

ChatRequest parse_anthropic_request(const ojson& b, const SamplingDefaults& d) {
  ChatRequest r;
  if (!integer(b, "max_tokens")) bad_field("max_tokens", "is required");
  r.s = sampling(b, d, "max_tokens");
  r.s.stop = string_list(b, "stop_sequences");
  ojson messages = ojson::array();
  if (b.contains("system") && !b["system"].is_null())
    messages.push_back({{"role", "system"}, {"content", anthropic_text(b["system"], "system")}});
  if (!b.contains("messages") || !b["messages"].is_array() || b["messages"].empty())
    bad_field("messages", "must be a non-empty list of messages");
  for (size_t i = 0; i < b["messages"].size(); ++i) {
    const ojson& m = b["messages"][i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    const std::string role = m.is_object() && m.contains("role") && m["role"].is_string()
                                 ? m["role"].get<std::string>()
                                 : "";
    if (role != "user" && role != "assistant") bad_field(at + ".role", "must be user or assistant");
    if (!m.contains("content")) bad_field(at + ".content", "is required");
    const ojson& c = m["content"];
    if (c.is_string()) {
      messages.push_back({{"role", role}, {"content", c}});
      continue;
    }
    if (!c.is_array()) bad_field(at + ".content", "must be a string or a list of blocks");
    std::string text;
    ojson tool_calls = ojson::array();
    for (const auto& blk : c) {
      const std::string type = blk.is_object() && blk.contains("type") && blk["type"].is_string()
                                   ? blk["type"].get<std::string>()
                                   : "";
      if (type == "text") {
        text += anthropic_text(ojson::array({blk}), at + ".content");
      } else if (type == "tool_use") {
        if (!blk.contains("name") || !blk.contains("id"))
          bad_field(at + ".content", "a tool_use block needs id and name");
        tool_calls.push_back(
            {{"id", blk["id"]},
             {"type", "function"},
             {"function",
              {{"name", blk["name"]}, {"arguments", blk.value("input", ojson::object())}}}});
      } else if (type == "tool_result") {
        if (!blk.contains("tool_use_id"))
          bad_field(at + ".content", "a tool_result block needs tool_use_id");
        const std::string out =
            blk.contains("content") ? anthropic_text(blk["content"], at + ".content") : "";
        messages.push_back(
            {{"role", "tool"}, {"tool_call_id", blk["tool_use_id"]}, {"content", out}});
      } else if (type != "thinking" && type != "redacted_thinking") {
        bad_field(at + ".content", "unsupported content block type '" + type + "'");
      }
    }
    if (!text.empty() || !tool_calls.empty()) {
      ojson msg = {{"role", role}, {"content", text}};
      if (!tool_calls.empty()) msg["tool_calls"] = tool_calls;
      messages.push_back(msg);
    }
  }
  r.messages = messages;
  if (b.contains("tools") && b["tools"].is_array() && !b["tools"].empty()) {
    ojson tools = ojson::array();
    for (const auto& t : b["tools"]) {
      if (!t.is_object() || !t.contains("name")) bad_field("tools", "each tool needs a name");
      tools.push_back({{"type", "function"},
                       {"function",
                        {{"name", t["name"]},
                         {"description", t.value("description", "")},
                         {"parameters", t.value("input_schema", ojson::object())}}}});
    }
    r.tools = tools;
  }
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const ojson& tc = b["tool_choice"];
    const std::string type = tc.is_object() && tc.contains("type") && tc["type"].is_string()
                                 ? tc["type"].get<std::string>()
                                 : "";
    if (type == "any") {
      r.tool_choice = "required";
    } else if (type == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string())
        bad_field("tool_choice.name", "is required for {type: tool} and must be a string");
      r.tool_choice = "function";
      r.tool_name = tc["name"].get<std::string>();
    } else if (type == "auto" || type == "none") {
      r.tool_choice = type;
    } else {
      bad_field("tool_choice", "must be {type: auto | any | tool | none}");
    }
    // disable_parallel_tool_use: at most one tool_use block.
    if (boolean(tc, "disable_parallel_tool_use").value_or(false)) r.parallel_tool_calls = false;
    check_tool_choice(r);
  }
  r.template_kwargs = template_kwargs(b);
  if (b.contains("thinking") && b["thinking"].is_object())
    r.template_kwargs["enable_thinking"] = b["thinking"].value("type", "") == "enabled";
  return r;
}

EmbeddingRequest parse_embedding_request(const ojson& b) {
  EmbeddingRequest r;
  r.model = string(b, "model").value_or("default_model");
  if (!b.contains("input") || b["input"].is_null()) bad_field("input", "is required");
  const ojson& in = b["input"];
  const char* kShape =
      "must be a string, a list of strings, a list of token ids or a list of "
      "lists of token ids";
  const auto ids_of = [&](const ojson& a, const std::string& at) {
    std::vector<int> ids;
    for (const auto& t : a) {
      if (!t.is_number_integer()) bad_field(at, "a token list must hold integers only");
      ids.push_back(token_id(t, at));
    }
    if (ids.empty()) bad_field(at, "is an empty token list");
    return ids;
  };
  if (in.is_string()) {
    r.texts.push_back(in.get<std::string>());
  } else if (in.is_array() && !in.empty() && in[0].is_number_integer()) {
    r.token_ids.push_back(ids_of(in, "input"));
  } else if (in.is_array() && !in.empty() && in[0].is_string()) {
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i].is_string()) bad_field("input[" + std::to_string(i) + "]", "must be a string");
      r.texts.push_back(in[i].get<std::string>());
    }
  } else if (in.is_array() && !in.empty() && in[0].is_array()) {
    for (size_t i = 0; i < in.size(); ++i) {
      const std::string at = "input[" + std::to_string(i) + "]";
      if (!in[i].is_array()) bad_field(at, "must be a list of token ids");
      r.token_ids.push_back(ids_of(in[i], at));
    }
  } else if (in.is_array() && in.empty()) {
    bad_field("input", "is an empty list");
  } else {
    bad_field("input", kShape);
  }
  for (size_t i = 0; i < r.texts.size(); ++i)
    if (r.texts[i].empty())
      bad_field(
          r.texts.size() == 1 && in.is_string() ? "input" : "input[" + std::to_string(i) + "]",
          "is an empty string");
  const std::string format = string(b, "encoding_format").value_or("float");
  if (format != "float" && format != "base64")
    bad_field("encoding_format", "must be float or base64, got " + format);
  r.base64 = format == "base64";
  r.dimensions = integer(b, "dimensions");
  if (r.dimensions && *r.dimensions <= 0) bad_field("dimensions", "must be > 0");
  return r;
}

}  // namespace lmx::server
