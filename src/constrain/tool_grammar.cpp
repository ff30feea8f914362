#include "constrain/tool_grammar.h"

#include "core/error.h"

namespace lmx::constrain {

namespace {

int add(Grammar& g, GrammarNode n) {
  g.nodes.push_back(std::move(n));
  return static_cast<int>(g.nodes.size()) - 1;
}

int literal(Grammar& g, std::string text) {
  GrammarNode n;
  n.kind = Kind::Literals;
  n.literals = {std::move(text)};
  return add(g, std::move(n));
}

int node_of(Grammar& g, Kind kind, std::vector<int> alts) {
  GrammarNode n;
  n.kind = kind;
  n.alts = std::move(alts);
  return add(g, std::move(n));
}

}  // namespace

Grammar tool_call_grammar(const std::vector<std::pair<std::string, Grammar>>& tools,
                          const ToolCallSyntax& syntax, bool parallel) {
  check(!tools.empty(), "tool-grammar", "no tools to call");
  Grammar g;
  std::vector<int> calls;
  const int close = literal(g, "}" + syntax.close);
  for (const auto& [name, args] : tools) {
    const int head = literal(g, syntax.open + "{\"name\": " + json(name).dump() + ", " +
                                    json(syntax.arguments_key).dump() + ": ");
    const int body = append_grammar(g, args);
    calls.push_back(node_of(g, Kind::Sequence, {head, body, close}));
  }
  const int call = calls.size() == 1 ? calls[0] : node_of(g, Kind::AnyOf, calls);
  if (!parallel || syntax.separator.empty()) {
    g.root = call;
    return g;
  }
  // calls := call | call separator calls
  const int many = node_of(g, Kind::AnyOf, {});
  const int more = node_of(g, Kind::Sequence, {call, literal(g, syntax.separator), many});
  g.nodes[many].alts = {call, more};
  g.root = many;
  return g;
}

Grammar after_text(const std::string& text, Grammar g) {
  if (text.empty()) return g;
  const int lit = literal(g, text);
  g.root = node_of(g, Kind::Sequence, {lit, g.root});
  return g;
}

}  // namespace lmx::constrain
