#include "constrain/token_constraint.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace lmx::constrain {

namespace {

constexpr size_t kMaxCachedMasks = 256;

// The bytes a token stands for in decoded text.
std::string token_bytes(const std::string& piece) {
  // <0xNN>: SentencePiece byte fallback.
  if (piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece[5] == '>')
    return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  std::string bytes;
  bool byte_level = true;
  for (size_t i = 0; i < piece.size() && byte_level;) {
    const int b = tok::unicode_to_byte(tok::next_codepoint(piece, i));
    if (b < 0) byte_level = false;
    bytes.push_back(static_cast<char>(b));
  }
  if (byte_level) return bytes;
  // Metaspace: U+2581 is a space.
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    const char32_t cp = tok::next_codepoint(piece, i);
    if (cp == 0x2581)
      out.push_back(' ');
    else
      tok::append_utf8(out, cp);
  }
  return out;
}

}  // namespace

std::shared_ptr<const TokenTable> TokenTable::build(const Tokenizer& tok) {
  auto t = std::make_shared<TokenTable>();
  const int n = tok.vocab_size();
  t->bytes.resize(n);
  t->trie.emplace_back();
  for (int id = 0; id < n; ++id) {
    if (tok.is_special(id)) continue;
    std::string piece;
    try {
      piece = tok.id_to_token(id);
    } catch (const Error&) {
      continue;  // a gap in the ids
    }
    t->bytes[id] = token_bytes(piece);
    int node = 0;
    for (char c : t->bytes[id]) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto& ch = t->trie[node].children;
      auto it = std::find_if(ch.begin(), ch.end(), [&](const auto& e) { return e.first == b; });
      if (it != ch.end()) {
        node = it->second;
      } else {
        const int next = static_cast<int>(t->trie.size());
        ch.emplace_back(b, next);
        t->trie.emplace_back();  // invalidates `ch`, not used after
        node = next;
      }
    }
    if (node != 0) t->trie[node].tokens.push_back(id);
  }
  return t;
}

JsonConstraint::JsonConstraint(std::shared_ptr<const TokenTable> table, Grammar grammar,
                               std::vector<int> eos)
    : table_(std::move(table)), automaton_(std::move(grammar)), eos_(std::move(eos)) {
  check(!eos_.empty(), "json-schema", "the model has no EOS token to end the value with");
  state_ = automaton_.initial();
}

void JsonConstraint::visit(const State& s, int node, std::vector<uint8_t>& mask) const {
  for (const auto& [b, child] : table_->trie[node].children) {
    State next = automaton_.feed(s, b);
    if (next.dead()) continue;
    for (int t : table_->trie[child].tokens) mask[t] = 1;
    visit(next, child, mask);
  }
}

const std::vector<uint8_t>& JsonConstraint::allowed() {
  const size_t n = table_->bytes.size();
  if (ended_) {
    mask_.assign(n, 0);
  } else {
    const std::string key = state_.key();
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCachedMasks) cache_.clear();
      std::vector<uint8_t> mask(n, 0);
      visit(state_, 0, mask);
      it = cache_.emplace(key, std::move(mask)).first;
    }
    mask_ = it->second;
  }
  const bool done = ended_ || automaton_.accepting(state_);
  for (int e : eos_)
    if (e >= 0 && static_cast<size_t>(e) < n) mask_[e] = done;
  check(std::find(mask_.begin(), mask_.end(), 1) != mask_.end(), "json-schema",
        "no token of the vocabulary can continue the output");
  return mask_;
}

void JsonConstraint::accept(int token) {
  const bool is_eos = std::find(eos_.begin(), eos_.end(), token) != eos_.end();
  if (is_eos) {
    check(ended_ || automaton_.accepting(state_), "json-schema",
          "EOS before the JSON value is complete");
    ended_ = true;
    return;
  }
  check(!ended_ && token >= 0 && static_cast<size_t>(token) < table_->bytes.size() &&
            !table_->bytes[token].empty(),
        "json-schema", "token ", token, " is not allowed here");
  State next = automaton_.feed(state_, table_->bytes[token]);
  check(!next.dead(), "json-schema", "token ", token, " is not allowed here");
  state_ = std::move(next);
}

bool JsonConstraint::complete() const { return ended_ || automaton_.accepting(state_); }

mx::array apply_constraint(const mx::array& logits, TokenConstraint& constraint) {
  const std::vector<uint8_t>& allowed = constraint.allowed();
  const int V = logits.shape(-1);
  std::vector<uint8_t> m(V, 0);
  std::copy_n(allowed.begin(), std::min<size_t>(allowed.size(), V), m.begin());
  mx::array mask(m.begin(), {V}, mx::bool_);
  return mx::where(mask, logits, mx::array(-INFINITY, logits.dtype()));
}

}  // namespace lmx::constrain
