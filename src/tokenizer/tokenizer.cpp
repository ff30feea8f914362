#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "core/error.h"
#include "core/json.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_node.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace lmx {

namespace fs = std::filesystem;

namespace tok {

struct TokenizerImpl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
  StringMap<int> added_ids;  // added token content -> id
  // Sorted by id, one per id; an added token overrides the model's token of its id.
  std::vector<std::pair<int, std::string_view>> added_by_id;
  std::vector<bool> added_at;  // per id: whether added_by_id has it, sparing most ids the search
  std::vector<bool> special_by_id;
  int vocab_size = 0;

  std::optional<int> bos;
  std::vector<int> eos;
  std::optional<bool> add_bos;
  std::string chat_template;

  std::optional<std::string_view> token(int id) const {
    if (id < 0 || size_t(id) >= added_at.size() || !added_at[size_t(id)]) {
      return model->id_to_token(id);
    }
    auto it = std::lower_bound(added_by_id.begin(), added_by_id.end(), id,
                               [](const auto& entry, int key) { return entry.first < key; });
    if (it != added_by_id.end() && it->first == id) return it->second;
    return model->id_to_token(id);
  }
  bool special(int id) const {
    return id >= 0 && size_t(id) < special_by_id.size() && special_by_id[size_t(id)];
  }
  std::optional<int> token_to_id(std::string_view token) const {
    if (auto it = added_ids.find(token); it != added_ids.end()) return it->second;
    return model->token_to_id(token);
  }
  void encode(std::string_view text, bool add_special_tokens, std::vector<int>& ids) const;
};

struct DetokenizerState {
  StringSink sink;
  Decoder::Stream stream;
};

void TokenizerImpl::encode(std::string_view text, bool add_special_tokens,
                           std::vector<int>& ids) const {
  size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos) fail("tokenizer", "invalid UTF-8 at byte ", bad);

  // As in `tokenizers`: split on raw added tokens, normalize each remaining piece, split that on
  // normalized added tokens, pre-tokenize what is left into words and encode each word.
  std::vector<AddedVocabulary::Segment> raw, normalized;
  std::vector<PreToken> words;
  std::string piece;
  added.split(text, false, raw);
  for (const auto& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    piece.assign(text.substr(seg.begin, seg.end - seg.begin));
    if (normalizer) normalizer->normalize(piece);
    if (piece.empty()) continue;
    added.split(piece, true, normalized);
    for (const auto& sub : normalized) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      if (sub.begin == sub.end) continue;
      words.clear();
      words.push_back(
          {piece.substr(sub.begin, sub.end - sub.begin), seg.begin == 0 && sub.begin == 0});
      if (pre_tokenizer) pre_tokenizer->pre_tokenize(words);
      for (const auto& w : words) model->tokenize(w.text, ids);
    }
  }
  if (add_special_tokens && post_processor) post_processor->process(ids);
}

namespace {

std::shared_ptr<TokenizerImpl> load_tokenizer_json(const fs::path& path) {
  json j = read_json_file(path);
  auto file = std::make_shared<const std::string>(path.string());
  Node root(j, file, "");
  if (!j.is_object()) root.fail("expected a JSON object, got ", Node::kind(j));

  auto impl = std::make_shared<TokenizerImpl>();
  impl->normalizer = make_normalizer(root.get("normalizer"));
  impl->pre_tokenizer = make_pre_tokenizer(root.get("pre_tokenizer"));

  Node model = root.at("model");
  // Files from old `tokenizers` versions leave out the model type.
  std::string type = model.has("type") ? model.type() : model.has("merges") ? "BPE" : "";
  if (type != "BPE") {
    if (model.has("type")) model.unsupported("BPE");
    model.fail("unsupported model, expected a BPE model (with merges), got ",
               model.raw().is_object() ? "none" : Node::kind(model.raw()));
  }
  impl->model = std::make_unique<BpeModel>(model);
  impl->post_processor = make_post_processor(root.get("post_processor"));
  impl->decoder = std::make_unique<Decoder>(root.get("decoder"));

  std::vector<AddedToken> added;
  Node list = root.get("added_tokens");
  if (!list.is_null()) {
    for (size_t i = 0; i < list.size(); ++i) {
      Node t = list[i];
      AddedToken a;
      a.content = t.str("content");
      int64_t id = t.at("id").as_int();
      if (id < 0 || id > kMaxTokenId)
        t.at("id").fail("expected an id in [0, ", kMaxTokenId, "], got ", id);
      a.id = int(id);
      a.special = t.boolean("special", false);
      a.lstrip = t.boolean("lstrip", false);
      a.rstrip = t.boolean("rstrip", false);
      a.normalized = t.boolean("normalized", !a.special);
      a.single_word = t.boolean("single_word", false);
      // `tokenizers` ignores empty added tokens.
      if (!a.content.empty()) added.push_back(std::move(a));
    }
  }

  // Ids below max_id: the model's and the added tokens'.
  size_t max_id = impl->model->id_limit();
  for (const auto& a : added) max_id = std::max(max_id, size_t(a.id) + 1);

  impl->added = AddedVocabulary(std::move(added), impl->normalizer.get());
  std::unordered_set<std::string_view> special_contents;
  int extra = 0;
  auto& by_id = impl->added_by_id;
  for (const auto& a : impl->added.tokens()) {
    impl->added_ids.insert_or_assign(a.content, a.id);
    by_id.emplace_back(a.id, a.content);
    if (a.special) special_contents.insert(a.content);
    if (!impl->model->token_to_id(a.content)) ++extra;
  }
  // Of added tokens sharing an id, the last one listed wins.
  std::stable_sort(by_id.begin(), by_id.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  auto last = std::unique(by_id.rbegin(), by_id.rend(),
                          [](const auto& x, const auto& y) { return x.first == y.first; });
  by_id.erase(by_id.begin(), last.base());
  by_id.shrink_to_fit();
  impl->added_at.assign(max_id, false);
  for (const auto& entry : by_id) impl->added_at[size_t(entry.first)] = true;
  impl->vocab_size = int(impl->model->vocab_size()) + extra;
  // Decoding skips by content, so a model token spelled like a special token is special too.
  impl->special_by_id.assign(max_id, false);
  for (size_t id = 0; id < max_id; ++id) {
    auto t = impl->token(int(id));
    impl->special_by_id[id] = t && special_contents.count(*t) > 0;
  }
  return impl;
}

// A tokenizer_config.json token entry: "text", {"content": "text", ...} or null.
std::optional<std::string> config_token(const Node& n) {
  if (n.is_null()) return std::nullopt;
  if (n.raw().is_string()) return n.as_string();
  if (n.raw().is_object()) return n.str("content");
  n.fail("expected a string or an object with \"content\", got ", Node::kind(n.raw()));
}

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), path.string(), "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void load_config(const fs::path& dir, TokenizerImpl& impl) {
  fs::path config_path = dir / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    json j = read_json_file(config_path);
    auto file = std::make_shared<const std::string>(config_path.string());
    Node root(j, file, "");
    if (!j.is_object()) root.fail("expected a JSON object, got ", Node::kind(j));
    // A token the vocabulary lacks leaves the id unset rather than failing the load, as
    // transformers does.
    if (auto bos = config_token(root.get("bos_token"))) impl.bos = impl.token_to_id(*bos);
    Node eos = root.get("eos_token");
    if (eos.raw().is_array()) {
      for (size_t i = 0; i < eos.size(); ++i) {
        if (auto t = config_token(eos[i]); t && impl.token_to_id(*t)) {
          impl.eos.push_back(*impl.token_to_id(*t));
        }
      }
    } else if (auto t = config_token(eos); t && impl.token_to_id(*t)) {
      impl.eos.push_back(*impl.token_to_id(*t));
    }
    if (root.has("add_bos_token")) impl.add_bos = root.at("add_bos_token").as_bool();
    Node tmpl = root.get("chat_template");
    if (tmpl.raw().is_string()) {
      impl.chat_template = tmpl.as_string();
    } else if (tmpl.raw().is_array()) {
      // Named templates: the "default" one, else the first.
      for (size_t i = 0; i < tmpl.size(); ++i) {
        std::string name = tmpl[i].str("name");
        if (name == "default" || i == 0) impl.chat_template = tmpl[i].str("template");
        if (name == "default") break;
      }
    } else if (!tmpl.is_null()) {
      tmpl.fail("expected a string or a list of {name, template}, got ", Node::kind(tmpl.raw()));
    }
  }
  if (impl.chat_template.empty()) {
    if (fs::exists(dir / "chat_template.jinja")) {
      impl.chat_template = read_text_file(dir / "chat_template.jinja");
    } else if (fs::exists(dir / "chat_template.json")) {
      fs::path p = dir / "chat_template.json";
      json j = read_json_file(p);
      Node root(j, std::make_shared<const std::string>(p.string()), "");
      impl.chat_template = root.str("chat_template");
    }
  }
}

}  // namespace
}  // namespace tok

Tokenizer Tokenizer::from_file(const fs::path& tokenizer_json) {
  return Tokenizer(tok::load_tokenizer_json(tokenizer_json));
}

Tokenizer Tokenizer::from_dir(const fs::path& dir) {
  check(fs::is_directory(dir), dir.string(),
        "not a directory, expected one holding tokenizer.json");
  auto impl = tok::load_tokenizer_json(dir / "tokenizer.json");
  tok::load_config(dir, *impl);
  return Tokenizer(std::move(impl));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, add_special_tokens, ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special_tokens) const {
  tok::StringSink sink;
  auto stream = impl_->decoder->start(&sink);
  for (int id : ids) {
    auto t = impl_->token(id);
    if (!t || (skip_special_tokens && impl_->special(id))) continue;
    stream.head()->push(*t, true, true);
  }
  stream.head()->flush();
  return std::move(sink.text());
}

std::optional<int> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->token_to_id(token);
}

std::string Tokenizer::id_to_token(int id) const {
  auto t = impl_->token(id);
  if (!t) fail("tokenizer", "id ", id, " is not in the vocabulary");
  return std::string(*t);
}

int Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int> Tokenizer::bos_token_id() const { return impl_->bos; }
std::vector<int> Tokenizer::eos_token_ids() const { return impl_->eos; }
std::optional<bool> Tokenizer::add_bos_token() const { return impl_->add_bos; }
bool Tokenizer::is_special(int id) const { return impl_->special(id); }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : impl_(tok.impl_), skip_special_(skip_special_tokens) {
  reset();
}

StreamingDetokenizer::~StreamingDetokenizer() = default;
StreamingDetokenizer::StreamingDetokenizer(StreamingDetokenizer&&) noexcept = default;
StreamingDetokenizer& StreamingDetokenizer::operator=(StreamingDetokenizer&&) noexcept = default;

void StreamingDetokenizer::reset() {
  state_ = std::make_unique<tok::DetokenizerState>();
  state_->stream = impl_->decoder->start(&state_->sink);
}

std::string StreamingDetokenizer::add(int id) {
  auto t = impl_->token(id);
  if (!t || (skip_special_ && impl_->special(id))) return {};
  state_->stream.head()->push(*t, true, true);
  return std::exchange(state_->sink.text(), {});
}

std::string StreamingDetokenizer::finalize() {
  state_->stream.head()->flush();
  std::string rest = std::exchange(state_->sink.text(), {});
  reset();
  return rest;
}

}  // namespace lmx
