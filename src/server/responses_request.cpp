// POST /v1/responses, the request side: the response store and the Responses body turned into a
// chat-completions body (responses_to_chat); the handler is in responses.cpp.
#include "server/api_error.h"
#include "server/responses.h"

namespace lmx::server {
void ResponseStore::expire() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = items_.begin(); it != items_.end();) {
    if (it->expires > now) {
      ++it;
      continue;
    }
    bytes_ -= it->bytes;
    it = items_.erase(it);
  }
}

void ResponseStore::put(const std::string& id, Entry e) {
  const size_t n = e.response.dump().size() + e.messages.dump().size() + id.size();
  std::lock_guard<std::mutex> lock(mu_);
  expire();
  if (n > max_bytes_) return;
  while (!items_.empty() && bytes_ + n > max_bytes_) {
    bytes_ -= items_.front().bytes;
    items_.pop_front();
  }
  items_.push_back({id, std::move(e), n, std::chrono::steady_clock::now() + ttl_});
  bytes_ += n;
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  expire();
  for (const auto& it : items_)
    if (it.id == id) return it.entry;
  return std::nullopt;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = items_.begin(); it != items_.end(); ++it)
    if (it->id == id) {
      bytes_ -= it->bytes;
      items_.erase(it);
      return true;
    }
  return false;
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

namespace {

// A message item's content (a string, or input_text / output_text parts) as chat text.
std::string item_text(const ojson& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(at, "must be a string or a list of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& p = content[i];
    const std::string pat = at + "[" + std::to_string(i) + "]";
    const std::string type = p.is_object() ? p.value("type", "") : "";
    if (type == "input_text" || type == "output_text" || type == "text") {
      if (!p.contains("text") || !p["text"].is_string())
        bad_field(pat + ".text", "must be a string");
      text += p["text"].get<std::string>();
    } else if (type == "refusal") {
      text += p.value("refusal", "");
    } else {
      bad_field(
          pat + ".type",
          "must be input_text or output_text (this server reads text only), got '" + type + "'");
    }
  }
  return text;
}

void add_input(const ojson& input, ojson& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array()) bad_field("input", "must be a string or a list of input items");
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& it = input[i];
    const std::string at = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) bad_field(at, "must be an object");
    const std::string type = it.value("type", it.contains("role") ? "message" : "");
    if (type == "message") {
      const std::string role = it.value("role", "");
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        bad_field(at + ".role", "must be user, assistant, system or developer, got '" + role + "'");
      if (!it.contains("content")) bad_field(at + ".content", "is required");
      messages.push_back({{"role", role}, {"content", item_text(it["content"], at + ".content")}});
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!it.contains(k) || !it[k].is_string())
          bad_field(at + "." + k, "is required and must be a string");
      ojson call = {{"id", it["call_id"]},
                    {"type", "function"},
                    {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
      // Consecutive calls are one assistant turn.
      if (!messages.empty() && messages.back()["role"] == "assistant" &&
          messages.back().contains("tool_calls"))
        messages.back()["tool_calls"].push_back(call);
      else
        messages.push_back(
            {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
    } else if (type == "function_call_output") {
      if (!it.contains("call_id") || !it["call_id"].is_string())
        bad_field(at + ".call_id", "is required and must be a string");
      if (!it.contains("output")) bad_field(at + ".output", "is required");
      const ojson& out = it["output"];
      messages.push_back(
          {{"role", "tool"},
           {"tool_call_id", it["call_id"]},
           {"content", out.is_string() ? out.get<std::string>() : item_text(out, at + ".output")}});
    } else if (type == "reasoning") {
      continue;  // the model's earlier reasoning is not shown to it again (as chat templates do)
    } else {
      bad_field(
          at + ".type",
          "must be message, function_call, function_call_output or reasoning, got '" + type + "'");
    }
  }
}

}  // namespace

ojson responses_to_chat(const ojson& b, ResponseStore& store) {
  ojson chat = ojson::object();
  ojson messages = ojson::array();
  if (b.contains("previous_response_id") && !b["previous_response_id"].is_null()) {
    if (!b["previous_response_id"].is_string())
      bad_field("previous_response_id", "must be a string");
    const std::string prev = b["previous_response_id"].get<std::string>();
    auto e = store.get(prev);
    if (!e)
      throw ApiError(404, "Previous response with id '" + prev + "' not found.",
                     "previous_response_id", "invalid_request_error",
                     "previous_response_not_found");
    // The earlier turns, without their instructions (they are not carried over).
    for (const auto& m : e->messages)
      if (m.value("role", "") != "system" || !m.value("instructions", false)) messages.push_back(m);
  }
  if (b.contains("instructions") && !b["instructions"].is_null()) {
    if (!b["instructions"].is_string()) bad_field("instructions", "must be a string");
    messages.insert(
        messages.begin(),
        ojson{{"role", "system"}, {"content", b["instructions"]}, {"instructions", true}});
  }
  if (!b.contains("input")) bad_field("input", "is required");
  add_input(b["input"], messages);
  if (messages.empty()) bad_field("input", "gives no messages");
  chat["messages"] = messages;
  for (const char* k :
       {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stream", "parallel_tool_calls",
        "adapter", "repetition_penalty", "logit_bias", "presence_penalty", "frequency_penalty",
        "speculative", "stop", "chat_template_kwargs", "ignore_eos"})
    if (b.contains(k)) chat[k] = b[k];
  if (b.contains("max_output_tokens") && !b["max_output_tokens"].is_null())
    chat["max_completion_tokens"] = b["max_output_tokens"];
  if (b.contains("tools") && !b["tools"].is_null()) {
    if (!b["tools"].is_array()) bad_field("tools", "must be a list of tools");
    ojson tools = ojson::array();
    for (size_t i = 0; i < b["tools"].size(); ++i) {
      const ojson& t = b["tools"][i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", "") != "function")
        bad_field(at + ".type", "must be function (this server runs no built-in tools)");
      if (!t.contains("name") || !t["name"].is_string())
        bad_field(at + ".name", "is required and must be a string");
      ojson f = {{"name", t["name"]}};
      if (t.contains("description")) f["description"] = t["description"];
      if (t.contains("parameters")) f["parameters"] = t["parameters"];
      tools.push_back({{"type", "function"}, {"function", f}});
    }
    chat["tools"] = tools;
  }
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const ojson& tc = b["tool_choice"];
    if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    else if (tc.is_string())
      chat["tool_choice"] = tc;
    else
      bad_field("tool_choice", "must be auto, none, required or {type: function, name}");
  }
  if (b.contains("text") && b["text"].is_object() && b["text"].contains("format")) {
    const ojson& f = b["text"]["format"];
    const std::string type = f.is_object() ? f.value("type", "") : "";
    if (type == "json_schema") {
      ojson js = {{"name", f.value("name", "response")}};
      if (f.contains("schema")) js["schema"] = f["schema"];
      chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
    } else if (type == "json_object" || type == "text") {
      chat["response_format"] = {{"type", type}};
    } else {
      bad_field("text.format.type", "must be text, json_object or json_schema, got '" + type + "'");
    }
  }
  if (b.contains("reasoning") && b["reasoning"].is_object() && b["reasoning"].contains("effort") &&
      b["reasoning"]["effort"].is_string())
    chat["reasoning_effort"] = b["reasoning"]["effort"];
  return chat;
}

}  // namespace lmx::server
