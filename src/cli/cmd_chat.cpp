// lmx chat: an interactive conversation in the terminal. Each turn renders the whole history
// with the model's chat template and generates through one lmx::Session, so only the new
// suffix of the conversation is prefilled; Ctrl-C stops the current answer.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "core/error.h"

namespace lmx::cli {

namespace {

std::atomic<bool> g_interrupted{false};

void on_sigint(int) { g_interrupted = true; }

// SIGINT without SA_RESTART: a blocked read returns, the handler only sets a flag.
void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

constexpr const char* kHelp =
    "Type a message and press Enter. Commands: /reset (forget the conversation), /system TEXT "
    "(set the system prompt and reset), /quit. Ctrl-C stops an answer, Ctrl-D quits.\n";

}  // namespace

int cmd_chat(const Args& args) {
  std::vector<FlagSpec> specs;
  for (auto& s : sampling_flags())
    if (s.name != "prompt" && s.name != "ignore-chat-template") specs.push_back(s);
  Flags f("chat", "Chat with a model in the terminal: streaming answers, multi-turn history.",
          specs);
  for (auto& spec : kv_cache_flags()) f.add(spec);
  for (auto& spec : speculative_flags()) f.add(spec);
  f.add({"system", "system prompt", false, "TEXT"});
  f.add({"chat-template", "chat template (a file, or the template text) instead of the model's",
         false, "T"});
  f.add({"chat-template-args",
         "JSON object of template variables, e.g. '{\"enable_thinking\":false}'", false, "JSON"});
  f.add({"verbose", "print prompt reuse and speed after each answer to standard error", true});
  f.add(
      {"exact", "tier L1: stock MLX ops, bit-exact with mlx-lm (default: the fast tier L3)", true});
  f.add({"no-cache-reuse", "prefill the whole conversation every turn (for comparison)", true});
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  GenerateOptions opt = generate_options(f);
  const std::string dir = resolve_model_flag(f);
  check(std::filesystem::is_directory(dir), "chat", "model directory '", dir, "' does not exist");
  const chat::ChatTemplate tmpl = chat::load_chat_template(dir, f.str("chat-template"));
  chat::TemplateOptions topt;
  if (f.has("chat-template-args")) {
    try {
      topt.kwargs = chat::ojson::parse(f.str("chat-template-args"));
    } catch (const chat::ojson::exception& e) {
      fail("chat", "--chat-template-args is not valid JSON: ", e.what());
    }
    check(topt.kwargs.is_object(), "chat", "--chat-template-args must be a JSON object, got ",
          topt.kwargs.type_name());
  }
  LanguageModel model =
      LanguageModel::load(dir, {.exact = f.on("exact"), .adapter_path = adapter_path(f)});
  set_speculative_options(f, model, f.on("exact"), opt);
  Session session(model);
  std::string system = f.str("system");
  chat::ojson history = chat::ojson::array();
  const auto reset = [&] {
    history = chat::ojson::array();
    if (!system.empty()) history.push_back({{"role", "system"}, {"content", system}});
    session.reset();
  };
  reset();
  install_sigint();
  std::fputs(kHelp, stdout);
  while (true) {
    std::fputs(">>> ", stdout);
    std::fflush(stdout);
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted) {  // Ctrl-C at the prompt: a fresh prompt
        std::cin.clear();
        std::clearerr(stdin);
        std::fputc('\n', stdout);
        continue;
      }
      std::fputc('\n', stdout);
      return 0;
    }
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") return 0;
    if (line == "/reset") {
      reset();
      std::fputs("(conversation reset)\n", stdout);
      continue;
    }
    if (line.rfind("/system", 0) == 0 && (line.size() == 7 || line[7] == ' ')) {
      system = line.size() > 8 ? line.substr(8) : "";
      reset();
      std::fputs(system.empty() ? "(system prompt cleared)\n" : "(system prompt set)\n", stdout);
      continue;
    }
    history.push_back({{"role", "user"}, {"content", line}});
    std::vector<int> ids;
    try {
      ids = model.encode(tmpl.render(history, topt), false);
    } catch (const Error& e) {
      history.erase(history.end() - 1);
      std::fprintf(stderr, "lmx: error: %s\n", e.what());
      continue;
    }
    std::string answer;
    g_interrupted = false;
    if (f.on("no-cache-reuse")) session.reset();
    const GenerationStats st = session.generate(ids, opt, [&](const TokenOutput& t) {
      answer.append(t.text);
      std::fwrite(t.text.data(), 1, t.text.size(), stdout);
      std::fflush(stdout);
      return !g_interrupted.load();
    });
    if (g_interrupted) std::fputs(" [stopped]", stdout);
    std::fputc('\n', stdout);
    history.push_back({{"role", "assistant"}, {"content", answer}});
    if (f.on("verbose"))
      std::fprintf(stderr,
                   "[prompt: %zu tokens, %d reused from the cache, %d prefilled, first token after "
                   "%.3f s; generation: %d tokens, %.1f tok/s]\n",
                   ids.size(), session.reused_tokens(), st.prompt_tokens, st.prompt_seconds,
                   st.generation_tokens, st.generation_tps());
    if (f.on("verbose") && opt.speculative())
      std::fprintf(stderr, "[%s]\n", speculative_summary(opt, st.speculative).c_str());
  }
}

}  // namespace lmx::cli
