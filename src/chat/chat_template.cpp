#include "chat/chat_template.h"

#include <fstream>
#include <sstream>

#include "chat/ast.h"
#include "chat/interpreter.h"
#include "chat/template_error.h"
#include "core/error.h"

namespace lmx::chat {

struct CompiledTemplate {
  Body body;
};

namespace {

constexpr const char* kWhere = "chat template";

// transformers' SPECIAL_TOKENS_ATTRIBUTES, the names special_tokens_map passes to the template.
constexpr const char* kSpecialNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                         "pad_token", "cls_token", "mask_token"};

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  check(f.good(), kWhere, "cannot read ", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json read_json(const std::filesystem::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    fail(kWhere, p.string(), ": invalid JSON: ", e.what());
  }
}

std::shared_ptr<const CompiledTemplate> compile(const std::string& source,
                                                const std::string& origin) {
  auto t = std::make_shared<CompiledTemplate>();
  try {
    t->body = parse(source);
  } catch (const TemplateError& e) {
    fail(kWhere, origin, " line ", e.line, ": ", e.what());
  } catch (const std::exception& e) {  // a bug of ours must still name the template
    fail(kWhere, origin, ": ", e.what());
  }
  return t;
}

// A special token as tokenizer_config.json stores it: a string or an AddedToken {content: ...}.
std::optional<std::string> token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return std::nullopt;
}

// transformers' _normalize_chat_messages + _alias_reasoning_fields.
Value prepare_messages(const json& messages) {
  if (!messages.is_array()) fail(kWhere, "messages must be an array, got ", messages.type_name());
  Value out = Value::make_list();
  for (size_t k = 0; k < messages.size(); ++k) {
    const json& m = messages[k];
    if (!m.is_object()) fail(kWhere, "messages[", k, "] must be an object, got ", m.type_name());
    Value msg = Value::make_dict();
    for (const auto& [key, v] : m.items())
      if (!v.is_null()) msg.dict->entries.emplace_back(key, from_json(v));
    const Value* reasoning = nullptr;
    for (const char* name : {"reasoning_content", "thinking", "reasoning"})
      if ((reasoning = msg.dict->find(name))) break;
    if (reasoning) {
      const Value r = *reasoning;
      Value aliased = Value::make_dict();
      aliased.dict->entries.emplace_back("thinking", r);
      for (const auto& [key, v] : msg.dict->entries) aliased.dict->set(key, v);
      aliased.dict->set("reasoning_content", r);
      msg = aliased;
    }
    out.list->push_back(msg);
  }
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::from_source(std::string source, std::string bos_token,
                                       std::string eos_token) {
  ChatTemplate t;
  t.origin_ = "template";
  t.templates_.emplace_back("default", compile(source, t.origin_));
  if (!bos_token.empty()) t.special_.emplace_back("bos_token", std::move(bos_token));
  if (!eos_token.empty()) t.special_.emplace_back("eos_token", std::move(eos_token));
  return t;
}

ChatTemplate ChatTemplate::from_model_dir(const std::filesystem::path& dir) {
  ChatTemplate t;
  const auto config_path = dir / "tokenizer_config.json";
  json config = json::object();
  if (std::filesystem::exists(config_path)) config = read_json(config_path);
  for (const char* name : kSpecialNames)
    if (config.contains(name))
      if (auto text = token_text(config[name])) t.special_.emplace_back(name, *text);

  const auto jinja_path = dir / "chat_template.jinja";
  const auto json_path = dir / "chat_template.json";
  if (std::filesystem::exists(jinja_path)) {
    t.origin_ = jinja_path.string();
    t.templates_.emplace_back("default", compile(read_text(jinja_path), t.origin_));
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    t.origin_ = config_path.string();
    const json& ct = config["chat_template"];
    if (ct.is_string()) {
      t.templates_.emplace_back("default", compile(ct.get<std::string>(), t.origin_));
    } else if (ct.is_array()) {
      for (const auto& e : ct) {
        check(e.is_object() && e.contains("name") && e.contains("template") &&
                  e["template"].is_string(),
              kWhere, config_path.string(), ": chat_template entries must be {name, template}");
        const std::string name = e["name"].get<std::string>();
        t.templates_.emplace_back(
            name, compile(e["template"].get<std::string>(), t.origin_ + " (" + name + ")"));
      }
    } else {
      fail(kWhere, config_path.string(), ": chat_template must be a string or a list, got ",
           ct.type_name());
    }
  } else if (std::filesystem::exists(json_path)) {
    t.origin_ = json_path.string();
    const json j = read_json(json_path);
    check(j.contains("chat_template") && j["chat_template"].is_string(), kWhere, t.origin_,
          ": expected a string 'chat_template'");
    t.templates_.emplace_back("default", compile(j["chat_template"].get<std::string>(), t.origin_));
  } else {
    fail(kWhere, "no chat template in ", dir.string(),
         ": expected tokenizer_config.json 'chat_template', chat_template.jinja or "
         "chat_template.json "
         "(or pass --chat-template)");
  }
  return t;
}

ChatTemplate ChatTemplate::with_source(std::string source, std::string origin) const {
  ChatTemplate t;
  t.origin_ = std::move(origin);
  t.special_ = special_;
  t.templates_.emplace_back("default", compile(source, t.origin_));
  return t;
}

std::string ChatTemplate::render(const json& messages, const TemplateOptions& options) const {
  // transformers' get_chat_template: "tool_use" when tools are given, else "default".
  const CompiledTemplate* chosen = nullptr;
  const auto find = [&](const char* name) -> const CompiledTemplate* {
    for (const auto& [n, c] : templates_)
      if (n == name) return c.get();
    return nullptr;
  };
  if (templates_.size() == 1)
    chosen = templates_[0].second.get();
  else if (options.tools && find("tool_use"))
    chosen = find("tool_use");
  else
    chosen = find("default");
  check(chosen != nullptr, kWhere, origin_, ": no 'default' template among the named templates");

  try {
    Dict vars;
    vars.set("messages", prepare_messages(messages));
    vars.set("tools", options.tools ? from_json(*options.tools) : Value::none());
    vars.set("documents", Value::none());
    vars.set("add_generation_prompt", Value::boolean(options.add_generation_prompt));
    for (const auto& [name, text] : special_) vars.set(name, Value::string(text));
    if (!options.kwargs.is_null()) {
      check(options.kwargs.is_object(), kWhere, "chat template kwargs must be an object, got ",
            options.kwargs.type_name());
      for (const auto& [k, v] : options.kwargs.items()) vars.set(k, from_json(v));
    }
    return chat::render(chosen->body, vars);
  } catch (const TemplateError& e) {
    if (e.line == 0) fail(kWhere, origin_, ": ", e.what());
    fail(kWhere, origin_, " line ", e.line, ": ", e.what());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // a bug of ours must still name the template
    fail(kWhere, origin_, ": ", e.what());
  }
}

std::string read_chat_template_arg(const std::string& arg) {
  std::error_code ec;
  if (arg.size() < 4096 && arg.find('\n') == std::string::npos &&
      std::filesystem::is_regular_file(arg, ec))
    return read_text(arg);
  return arg;
}

ChatTemplate load_chat_template(const std::filesystem::path& model_dir,
                                const std::string& override_arg) {
  if (override_arg.empty()) return ChatTemplate::from_model_dir(model_dir);
  ChatTemplate base;
  try {
    base = ChatTemplate::from_model_dir(model_dir);
  } catch (const Error&) {
    // No template of its own: the override still gets the special tokens.
    ChatTemplate t = ChatTemplate::from_source("");
    const auto config_path = model_dir / "tokenizer_config.json";
    if (std::filesystem::exists(config_path)) {
      const json config = read_json(config_path);
      for (const char* name : kSpecialNames)
        if (config.contains(name))
          if (auto text = token_text(config[name])) t.special_.emplace_back(name, *text);
    }
    base = t;
  }
  return base.with_source(read_chat_template_arg(override_arg));
}

}  // namespace lmx::chat
