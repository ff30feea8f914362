// Chat templates: the input is "<template source>\0<messages JSON>\0<kwargs JSON>"; the source is
// compiled (ChatTemplate::from_source: lexer, parser) and rendered with the messages (a default
// conversation when that part is not a JSON array), tools and the kwargs. Only lmx::Error may come
// out (template syntax errors, raise_exception, undefined operations).
#include "chat/chat_template.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lmx;
  using chat::ojson;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto next = [&in] {
    const size_t nul = in.find('\0');
    std::string_view part = in.substr(0, nul);
    in = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
    return part;
  };
  const std::string source(next());
  const ojson messages_in = ojson::parse(next(), nullptr, false);
  const ojson kwargs_in = ojson::parse(next(), nullptr, false);
  const ojson messages = messages_in.is_array()
                             ? messages_in
                             : ojson::parse(R"([{"role":"system","content":"Be brief."},
                             {"role":"user","content":"Hi"},
                             {"role":"assistant","content":"Hello","tool_calls":[{"type":"function",
                              "function":{"name":"f","arguments":{"x":1}}}]},
                             {"role":"tool","content":"42"}])");
  fuzz::expect_only<Error>("chat_template", [&] {
    const auto t = chat::ChatTemplate::from_source(source, "<s>", "</s>");
    chat::TemplateOptions o;
    if (kwargs_in.is_object()) o.kwargs = kwargs_in;
    t.render(messages, o);
    o.add_generation_prompt = false;
    o.tools = ojson::parse(R"([{"type":"function","function":{"name":"f","description":"d",
        "parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}])");
    t.render(messages, o);
  });
  return 0;
}
