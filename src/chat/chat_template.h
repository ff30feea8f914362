// A model's chat template, rendered by lmx's own Jinja2 interpreter byte-identically to
// transformers' tokenizer.apply_chat_template(messages, tokenize=False, ...).
//
// JSON here is nlohmann::ordered_json (lmx::chat::ojson): Python dicts keep insertion order and
// `tojson` / dict reprs in templates print keys in that order, so parse request bodies with
// ojson::parse to keep the client's key order. An lmx::json converts implicitly (keys sorted).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace lmx::chat {

using json = ojson;

struct TemplateOptions {
  bool add_generation_prompt = true;
  std::optional<json> tools;  // OpenAI-style tools array, passed to the template as `tools`
  // chat_template_kwargs / --chat-template-args: enable_thinking, ...
  json kwargs = json::object();
};

struct CompiledTemplate;

class ChatTemplate;
ChatTemplate load_chat_template(const std::filesystem::path& model_dir,
                                const std::string& override_arg);

class ChatTemplate {
 public:
  // tokenizer_config.json `chat_template` (a string, or a list of {name, template} where
  // "tool_use" is picked when tools are given and "default" otherwise), overridden by
  // chat_template.jinja, else chat_template.json; the special tokens (bos_token, eos_token,
  // unk_token, pad_token, ...) from tokenizer_config.json. Throws lmx::Error naming the file when
  // none is found or it fails to parse.
  static ChatTemplate from_model_dir(const std::filesystem::path& dir);
  // bos/eos "" leave `bos_token` / `eos_token` undefined, as for a tokenizer without them.
  static ChatTemplate from_source(std::string source, std::string bos_token = "",
                                  std::string eos_token = "");

  // messages: OpenAI-style array of {role, content (string or parts), tool_calls, tool_call_id,
  // reasoning_content, ...}. Keys with null values are dropped and reasoning fields aliased as
  // transformers does. Throws lmx::Error with the template line (raise_exception text included).
  // Thread-safe: a compiled template is immutable and each call renders with its own state.
  std::string render(const json& messages, const TemplateOptions& options = {}) const;

  // The same template with another source (--chat-template), keeping the special tokens.
  ChatTemplate with_source(std::string source, std::string origin = "--chat-template") const;

  const std::vector<std::pair<std::string, std::string>>& special_tokens() const {
    return special_;
  }

 private:
  friend ChatTemplate load_chat_template(const std::filesystem::path&, const std::string&);
  std::string origin_;  // file or description, for errors
  std::vector<std::pair<std::string, std::shared_ptr<const CompiledTemplate>>> templates_;
  std::vector<std::pair<std::string, std::string>> special_;
};

// --chat-template's value: the contents of the file it names when one exists, else the template
// text itself (mlx_lm.server passes the text).
std::string read_chat_template_arg(const std::string& arg);

// The model's template, or `override_arg` (see read_chat_template_arg) when it is not empty.
ChatTemplate load_chat_template(const std::filesystem::path& model_dir,
                                const std::string& override_arg);

}  // namespace lmx::chat
