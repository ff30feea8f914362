#include "convert/gguf_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

#include "convert/common.h"
#include "core/error.h"

namespace lmx::convert {

namespace fs = std::filesystem;

namespace {

constexpr int kTokenControl = 3;            // llama.cpp token type CONTROL
constexpr int kTokenUserDefined = 4;        // USER_DEFINED
const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

// Split regexes of transformers' GGUF_PRE_TOKENIZER_SPLITS, by `tokenizer.ggml.pre`.
const char* kLlama3Split = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
                           R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Split = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)"
                          R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen35Split = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|)"
                           R"( ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kGpt4oSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|)"
    R"('t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|)"
    R"('t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|)"
    R"(\s+(?!\S)|\s+)";

const std::map<std::string, const char*>& pre_splits() {
  static const std::map<std::string, const char*> m = {
      {"llama3", kLlama3Split},       {"llama-v3", kLlama3Split},
      {"llama-bpe", kLlama3Split},    {"falcon3", kLlama3Split},
      {"falcon-h1", kLlama3Split},    {"pixtral", kLlama3Split},
      {"midm-2.0", kLlama3Split},     {"lfm2", kLlama3Split},
      {"jina-v5-nano", kLlama3Split}, {"dbrx", kLlama3Split},
      {"smaug-bpe", kLlama3Split},    {"tekken", kTekkenSplit},
      {"qwen2", kQwen2Split},         {"deepseek-r1-qwen", kQwen2Split},
      {"kormo", kQwen2Split},         {"f2llmv2", kQwen2Split},
      {"megrez", kQwen2Split},        {"qwen35", kQwen35Split},
      {"gpt-4o", kGpt4oSplit},        {"llama4", kGpt4oSplit},
      {"kanana2", kGpt4oSplit},       {"talkie", kGpt4oSplit},
      {"minimax-m2", kGpt4oSplit},
  };
  return m;
}

// Names llama.cpp treats as end-of-generation (llama-vocab.cpp), the common ones.
const std::set<std::string> kEogNames = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>",  "<end_of_turn>",
    "<|endoftext|>",      "<|eom_id|>", "<EOT>",    "<|end_of_text|>",
    "<end_of_utterance>", "<|return|>", "<|call|>",
};

// Decodes UTF-8; returns the code points or nullopt when invalid.
std::optional<std::vector<uint32_t>> utf8_decode(const std::string& s,
                                                 std::vector<size_t>* offsets = nullptr) {
  std::vector<uint32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return std::nullopt;
    }
    if (i + len > s.size()) return std::nullopt;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (offsets) offsets->push_back(i);
    out.push_back(cp);
    i += len;
  }
  if (offsets) offsets->push_back(s.size());
  return out;
}

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// Python's str.isspace(), which is what str.strip() removes.
bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
std::vector<uint32_t> byte_to_unicode() {
  std::vector<uint32_t> map(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xa1; b <= 0xac; ++b) printable[b] = true;
  for (int b = 0xae; b <= 0xff; ++b) printable[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) map[b] = printable[b] ? b : 256 + n++;
  return map;
}

std::string jstr(const std::string& s, const std::string& what) {
  try {
    return json(s).dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception&) {
    fail("tokenizer", what, " is not valid UTF-8");
  }
}

struct Added {
  std::string content;
  bool special = false;
};

}  // namespace

std::vector<std::pair<std::string, std::string>> generate_merges(
    const std::vector<std::string>& tokens, const std::vector<double>& scores) {
  std::unordered_map<std::string, int64_t> vocab;  // last index wins
  vocab.reserve(tokens.size() * 2);
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = static_cast<int64_t>(i);

  struct Merge {
    double score;
    int64_t len_l, len_r;
    std::string l, r;
  };
  std::vector<Merge> merges;
  std::unordered_map<std::string, bool> seen;
  seen.reserve(tokens.size() * 2);
  std::vector<size_t> offsets;
  std::vector<Merge> local;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& s = tokens[i];
    if (!seen.emplace(s, true).second) continue;  // dict keeps the first position
    const double score = scores[vocab[s]];        // ... and the last value
    offsets.clear();
    auto cps = utf8_decode(s, &offsets);
    if (!cps) continue;  // reported elsewhere
    local.clear();
    for (size_t k = 1; k < cps->size(); ++k) {
      std::string l = s.substr(0, offsets[k]), r = s.substr(offsets[k]);
      if (vocab.count(l) && vocab.count(r))
        local.push_back({score, static_cast<int64_t>(k), static_cast<int64_t>(cps->size() - k),
                         std::move(l), std::move(r)});
    }
    std::sort(local.begin(), local.end(), [&](const Merge& a, const Merge& b) {
      const int64_t al = vocab[a.l], bl = vocab[b.l];
      if (al != bl) return al < bl;
      return vocab[a.r] < vocab[b.r];
    });
    for (auto& m : local) merges.push_back(std::move(m));
  }
  // sorted(..., key=(score, len l, len r), reverse=True) is stable for equal keys.
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.len_l != b.len_l) return a.len_l > b.len_l;
    return a.len_r > b.len_r;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (auto& m : merges) out.emplace_back(std::move(m.l), std::move(m.r));
  return out;
}

GgufTokenizer build_gguf_tokenizer(const gguf::File& file, const std::string& arch,
                                   int64_t model_max_length) {
  const std::string& where = file.path();
  const std::string model = file.get_string("tokenizer.ggml.model");
  const json& jtokens = file.get_array("tokenizer.ggml.tokens", gguf::ValueType::kString);
  std::vector<std::string> tokens;
  tokens.reserve(jtokens.size());
  for (const auto& t : jtokens) tokens.push_back(t.get<std::string>());
  const int64_t n = static_cast<int64_t>(tokens.size());
  check(n > 0, where, "tokenizer.ggml.tokens is empty");

  std::vector<int> types(n, 1);
  if (file.has("tokenizer.ggml.token_type")) {
    const json& jt = file.get_array("tokenizer.ggml.token_type");
    check(static_cast<int64_t>(jt.size()) == n, where, "tokenizer.ggml.token_type has ", jt.size(),
          " entries, expected ", n);
    for (int64_t i = 0; i < n; ++i) {
      check(jt[i].is_number_integer(), where, "tokenizer.ggml.token_type[", i,
            "] is not an integer");
      types[i] = jt[i].get<int>();
    }
  }
  auto token_id = [&](const std::string& key) -> std::optional<int64_t> {
    auto v = file.opt_int("tokenizer.ggml." + key);
    if (!v) return std::nullopt;
    check(*v >= 0 && *v < n, where, "tokenizer.ggml.", key, " ", *v, " is outside the ", n,
          "-token vocabulary");
    return v;
  };
  GgufTokenizer out;
  out.vocab_size = n;
  out.bos_id = token_id("bos_token_id");
  out.eos_id = token_id("eos_token_id");
  out.pad_id = token_id("padding_token_id");
  const auto unk_id = token_id("unknown_token_id");

  const bool byte_level = model == "gpt2";
  const bool spm = model == "llama";
  check(byte_level || spm, where, "tokenizer.ggml.model '", model,
        "' is not supported, expected 'gpt2' (byte-level BPE) or 'llama' (SentencePiece)");
  const bool gemma = spm && (arch == "gemma" || arch == "gemma2" || arch == "gemma3");
  const bool add_bos = file.opt_bool("tokenizer.ggml.add_bos_token").value_or(spm);
  const bool add_eos = file.opt_bool("tokenizer.ggml.add_eos_token").value_or(false);

  // Vocabulary spelling. `orig` keeps the file's spelling: transformers adds tokens by it.
  const std::vector<std::string> orig = tokens;
  std::vector<bool> in_alphabet_all(n, true);
  if (byte_level) {
    const std::vector<uint32_t> b2u = byte_to_unicode();
    const std::set<uint32_t> alphabet(b2u.begin(), b2u.end());
    for (int64_t i = 0; i < n; ++i) {
      auto cps = utf8_decode(tokens[i]);
      check(cps.has_value(), where, "token ", i, " is not valid UTF-8");
      bool all = true;
      for (uint32_t c : *cps) all = all && alphabet.count(c);
      in_alphabet_all[i] = all;
      if (!all) {  // spell the UTF-8 bytes in the byte alphabet
        std::string s;
        for (unsigned char b : tokens[i]) s += utf8_encode(b2u[b]);
        tokens[i] = s;
      }
    }
  } else if (gemma) {
    // Tokens of only whitespace that contain a space are stored with real spaces; the model
    // spells them with U+2581 (transformers gemma_tokenizer).
    for (int64_t i = 0; i < n; ++i) {
      auto cps = utf8_decode(tokens[i]);
      check(cps.has_value(), where, "token ", i, " is not valid UTF-8");
      bool has_space = false, all_ws = true;
      for (uint32_t c : *cps) {
        has_space = has_space || c == ' ';
        all_ws = all_ws && py_isspace(c);
      }
      if (has_space && all_ws) {
        std::string s;
        for (size_t k = 0; k < cps->size(); ++k) s += kSpace;
        tokens[i] = s;
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i)
      check(utf8_decode(tokens[i]).has_value(), where, "token ", i, " is not valid UTF-8");
  }
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(n * 2);
  for (int64_t i = 0; i < n; ++i) vocab[tokens[i]] = i;

  // Merges: from the file, else derived from the vocabulary.
  std::vector<std::pair<std::string, std::string>> merges;
  if (file.has("tokenizer.ggml.merges")) {
    const json& jm = file.get_array("tokenizer.ggml.merges", gguf::ValueType::kString);
    merges.reserve(jm.size());
    for (size_t i = 0; i < jm.size(); ++i) {
      const std::string m = jm[i].get<std::string>();
      const size_t sp = m.find(' ');
      check(sp != std::string::npos && m.find(' ', sp + 1) == std::string::npos, where,
            "tokenizer.ggml.merges[", i, "] '", m, "' is not two tokens separated by a space");
      merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
  } else {
    check(!byte_level, where, "byte-level tokenizer without tokenizer.ggml.merges");
    std::vector<double> scores(n);
    if (gemma) {
      // Gemma's scores do not follow its merge order; the token order does.
      for (int64_t i = 0; i < n; ++i) scores[i] = -static_cast<double>(i);
    } else {
      const json& js = file.get_array("tokenizer.ggml.scores");
      check(static_cast<int64_t>(js.size()) == n, where, "tokenizer.ggml.scores has ", js.size(),
            " entries, expected ", n);
      for (int64_t i = 0; i < n; ++i) scores[i] = js[i].get<double>();
    }
    merges = generate_merges(tokens, scores);
  }

  // Added tokens: control tokens as special (for byte-level only those spelled in the byte
  // alphabet), user-defined ones as plain added tokens, then the tokenizer class's named tokens.
  std::map<int64_t, Added> added;
  auto add = [&](const std::string& content, bool special) {
    auto it = vocab.find(content);
    if (it == vocab.end()) return;
    auto [a, inserted] = added.emplace(it->second, Added{content, special});
    if (!inserted) a->second.special = a->second.special || special;
  };
  for (int64_t i = 0; i < n; ++i)
    if (types[i] == kTokenControl && in_alphabet_all[i]) add(orig[i], true);
  for (int64_t i = 0; i < n; ++i)
    if (types[i] == kTokenUserDefined) add(orig[i], false);
  if (byte_level) {
    add("<|endoftext|>", true);  // GPT2Tokenizer's default unk/bos/eos
  } else if (gemma) {
    for (const char* t : {"<unk>", "<bos>", "<eos>", "<pad>", "<mask>"}) add(t, true);
  } else {
    for (const char* t : {"<unk>", "<s>", "</s>"}) add(t, true);
  }
  for (const auto& id : {out.bos_id, out.eos_id, unk_id, out.pad_id})
    if (id) add(orig[*id], true);

  // Pipeline pieces.
  json normalizer = nullptr, pre_tokenizer, decoder, post_processor = nullptr, bpe;
  if (byte_level) {
    const std::string pre = file.opt_string("tokenizer.ggml.pre").value_or("default");
    const json byte_level_regex = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", true},
                                   {"use_regex", true}};
    if (auto it = pre_splits().find(pre); it != pre_splits().end()) {
      pre_tokenizer = {{"type", "Sequence"},
                       {"pretokenizers",
                        {{{"type", "Split"},
                          {"pattern", {{"Regex", it->second}}},
                          {"behavior", "Isolated"},
                          {"invert", false}},
                         {{"type", "ByteLevel"},
                          {"add_prefix_space", false},
                          {"trim_offsets", true},
                          {"use_regex", false}}}}};
    } else if (pre == "smollm") {
      // llama.cpp's smollm pre-tokenizer: digits one by one, then the GPT-2 split.
      pre_tokenizer = {
          {"type", "Sequence"},
          {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level_regex}}};
    } else {
      if (pre != "gpt2" && pre != "default")
        std::fprintf(stderr, "[WARN] tokenizer.ggml.pre '%s' has no known split; using GPT-2's\n",
                     pre.c_str());
      pre_tokenizer = byte_level_regex;
    }
    decoder = {{"type", "ByteLevel"},
               {"add_prefix_space", true},
               {"trim_offsets", true},
               {"use_regex", true}};
    if (!add_bos && !add_eos)
      post_processor = {{"type", "ByteLevel"},
                        {"add_prefix_space", true},
                        {"trim_offsets", false},
                        {"use_regex", true}};
    bpe = {{"type", "BPE"},
           {"dropout", nullptr},
           {"unk_token", nullptr},
           {"continuing_subword_prefix", ""},
           {"end_of_word_suffix", ""},
           {"fuse_unk", false},
           {"byte_fallback", false},
           {"ignore_merges", false}};
  } else {
    json steps =
        json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}});
    if (gemma) {
      normalizer = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
      pre_tokenizer = nullptr;  // GemmaTokenizer's split on " " is a no-op after the normalizer
    } else {
      pre_tokenizer = {{"type", "Metaspace"},
                       {"replacement", kSpace},
                       {"prepend_scheme", "first"},
                       {"split", false}};
      steps.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    }
    decoder = {{"type", "Sequence"}, {"decoders", steps}};
    json unk = nullptr;
    if (gemma) unk = unk_id ? orig[*unk_id] : std::string("<unk>");
    bpe = {{"type", "BPE"},
           {"dropout", nullptr},
           {"unk_token", unk},
           {"continuing_subword_prefix", nullptr},
           {"end_of_word_suffix", nullptr},
           {"fuse_unk", true},
           {"byte_fallback", true},
           {"ignore_merges", false}};
  }
  // transformers update_post_processor: "bos:0 $A:0 eos:0" and the pair form.
  const bool use_bos = add_bos && out.bos_id.has_value();
  const bool use_eos = add_eos && out.eos_id.has_value();
  if (use_bos || use_eos) {
    json single = json::array(), pair = json::array(), specials = json::object();
    auto special = [&](int64_t id, int type_id) {
      return json{{"SpecialToken", {{"id", orig[id]}, {"type_id", type_id}}}};
    };
    auto seq = [](const char* s, int type_id) {
      return json{{"Sequence", {{"id", s}, {"type_id", type_id}}}};
    };
    if (use_bos) single.push_back(special(*out.bos_id, 0));
    single.push_back(seq("A", 0));
    if (use_eos) single.push_back(special(*out.eos_id, 0));
    pair = single;
    if (use_bos) pair.push_back(special(*out.bos_id, 1));
    pair.push_back(seq("B", 1));
    if (use_eos) pair.push_back(special(*out.eos_id, 1));
    for (const auto& id :
         {use_bos ? out.bos_id : std::nullopt, use_eos ? out.eos_id : std::nullopt})
      if (id) specials[orig[*id]] = {{"id", orig[*id]}, {"ids", {*id}}, {"tokens", {orig[*id]}}};
    post_processor = {{"type", "TemplateProcessing"},
                      {"single", single},
                      {"pair", pair},
                      {"special_tokens", specials}};
  }

  // Serialize; vocab and merges are written directly (262k entries for Gemma).
  std::string s;
  s.reserve(static_cast<size_t>(n) * 40 + merges.size() * 24);
  s += "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  s += "  \"added_tokens\": [";
  bool first = true;
  for (const auto& [id, a] : added) {
    json e = {{"id", id},        {"content", a.content}, {"single_word", false}, {"lstrip", false},
              {"rstrip", false}, {"normalized", false},  {"special", a.special}};
    s += first ? "\n    " : ",\n    ";
    s += e.dump(-1, ' ', false, json::error_handler_t::replace);
    first = false;
  }
  s += "\n  ],\n";
  auto piece = [&](const char* name, const json& j) {
    s += std::string("  \"") + name + "\": " + j.dump(-1, ' ', false) + ",\n";
  };
  piece("normalizer", normalizer);
  piece("pre_tokenizer", pre_tokenizer);
  piece("post_processor", post_processor);
  piece("decoder", decoder);
  std::string head = bpe.dump(-1, ' ', false);
  head.pop_back();  // reopen the object to append vocab and merges
  s += "  \"model\": " + head + ",\"vocab\":{";
  first = true;
  for (int64_t i = 0; i < n; ++i) {
    if (vocab[tokens[i]] != i) continue;  // a duplicate: the last id wins, as in a dict
    if (!first) s += ',';
    s += jstr(tokens[i], "token " + std::to_string(i));
    s += ':';
    s += std::to_string(i);
    first = false;
  }
  s += "},\"merges\":[";
  for (size_t i = 0; i < merges.size(); ++i) {
    if (i) s += ',';
    s += '[';
    s += jstr(merges[i].first, "merge " + std::to_string(i));
    s += ',';
    s += jstr(merges[i].second, "merge " + std::to_string(i));
    s += ']';
  }
  s += "]}\n}\n";
  out.tokenizer_json = std::move(s);

  // tokenizer_config.json: the generic fast tokenizer class loads tokenizer.json as it is.
  ojson tc;
  tc["add_bos_token"] = add_bos;
  tc["add_eos_token"] = add_eos;
  if (out.bos_id) tc["bos_token"] = orig[*out.bos_id];
  if (out.eos_id) tc["eos_token"] = orig[*out.eos_id];
  if (unk_id) tc["unk_token"] = orig[*unk_id];
  if (out.pad_id) tc["pad_token"] = orig[*out.pad_id];
  if (auto t = file.opt_string("tokenizer.chat_template")) tc["chat_template"] = *t;
  tc["clean_up_tokenization_spaces"] = false;
  tc["model_max_length"] = model_max_length;
  tc["tokenizer_class"] = "PreTrainedTokenizerFast";
  out.tokenizer_config = tc;

  std::set<int64_t> eog;
  for (const auto& id : {token_id("eot_token_id"), token_id("eom_token_id")})
    if (id) eog.insert(*id);
  for (int64_t i = 0; i < n; ++i)
    if (kEogNames.count(orig[i])) eog.insert(i);
  if (out.eos_id) {
    out.eos_ids.push_back(*out.eos_id);
    eog.erase(*out.eos_id);
  }
  out.eos_ids.insert(out.eos_ids.end(), eog.begin(), eog.end());
  ojson gc;
  if (out.bos_id) gc["bos_token_id"] = *out.bos_id;
  if (out.eos_ids.size() == 1) {
    gc["eos_token_id"] = out.eos_ids[0];
  } else if (!out.eos_ids.empty()) {
    gc["eos_token_id"] = out.eos_ids;
  }
  if (out.pad_id) gc["pad_token_id"] = *out.pad_id;
  out.generation_config = gc;
  return out;
}

void write_gguf_tokenizer(const GgufTokenizer& tok, const fs::path& dir) {
  const fs::path p = dir / "tokenizer.json";
  std::ofstream f(p, std::ios::binary);
  check(f.good(), p.string(), "cannot open for writing");
  f << tok.tokenizer_json;
  f.close();
  check(f.good(), p.string(), "write failed");
  write_json(dir / "tokenizer_config.json", tok.tokenizer_config, 2);
  write_json(dir / "generation_config.json", tok.generation_config, 2);
}

}  // namespace lmx::convert
