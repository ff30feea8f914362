// JSON-schema constrained decoding: the token mask of a JsonAutomaton state over a tokenizer's
// vocabulary. Each token's bytes are simulated from the current state, sharing prefixes through
// a byte trie of the vocabulary; masks are cached per automaton state.
#pragma once

#include <mlx/mlx.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "constrain/json_automaton.h"
#include "lmx/lmx.h"
#include "tokenizer/tokenizer.h"

namespace lmx::constrain {

namespace mx = mlx::core;

// Every token's bytes as decoded text would have them (byte-level characters mapped back,
// <0xNN> byte tokens, Metaspace's U+2581 as a space); empty for special tokens, which the
// automaton never allows. Built once per model.
struct TokenTable {
  std::vector<std::string> bytes;  // by token id
  struct TrieNode {
    std::vector<std::pair<uint8_t, int>> children;
    std::vector<int> tokens;  // tokens whose bytes end here
  };
  std::vector<TrieNode> trie;  // trie[0]: the root
  static std::shared_ptr<const TokenTable> build(const Tokenizer& tok);
};

class JsonConstraint final : public TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const TokenTable> table, Grammar grammar, std::vector<int> eos);
  const std::vector<uint8_t>& allowed() override;
  void accept(int token) override;
  bool complete() const override;

 private:
  void visit(const State& s, int node, std::vector<uint8_t>& mask) const;

  std::shared_ptr<const TokenTable> table_;
  JsonAutomaton automaton_;
  std::vector<int> eos_;
  State state_;
  bool ended_ = false;  // an EOS token was accepted
  std::vector<uint8_t> mask_;
  std::unordered_map<std::string, std::vector<uint8_t>> cache_;  // state key -> mask (no EOS)
};

// logits (1, V): tokens the constraint does not allow set to -inf (ids past its vocabulary too).
mx::array apply_constraint(const mx::array& logits, TokenConstraint& constraint);

}  // namespace lmx::constrain
