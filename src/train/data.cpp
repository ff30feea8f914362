#include "train/data.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "core/error.h"

namespace lmx::train {

namespace {

enum class Format { text, completions, chat, preference };

const char* format_name(Format f) {
  switch (f) {
    case Format::text:
      return "text";
    case Format::completions:
      return "prompt/completion";
    case Format::chat:
      return "messages";
    case Format::preference:
      break;
  }
  return "prompt/chosen/rejected (--train-mode dpo|orpo)";
}

std::vector<int> encode_chat(const TextCodec& codec, const chat::ojson& messages,
                             const std::optional<chat::ojson>& tools, bool add_generation_prompt) {
  chat::TemplateOptions o;
  o.add_generation_prompt = add_generation_prompt;
  if (tools && !tools->is_null()) o.tools = *tools;
  // transformers' apply_chat_template(tokenize=True) encodes without special tokens.
  return codec.tokenizer->encode(codec.chat_template().render(messages, o), false);
}

}  // namespace

Dataset load_jsonl(const fs::path& file, const TextCodec& codec, const DataOptions& opt) {
  Dataset out;
  out.source = file.string();
  out.preference = opt.preference;
  if (!fs::exists(file)) return out;
  std::ifstream in(file);
  check(in.good(), out.source, "cannot open the data file");
  std::optional<Format> format;
  std::optional<int> eos;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = out.source + ":" + std::to_string(number);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    chat::ojson row;
    try {
      row = chat::ojson::parse(line);
    } catch (const chat::ojson::exception& e) {
      fail(where, "malformed JSON: ", e.what());
    }
    check(row.is_object(), where, "expected a JSON object per line, got ", row.type_name());
    if (!format && opt.preference) format = Format::preference;
    if (!format) {
      // create_dataset's order: prompt/completion, then messages, then text.
      if (row.contains(opt.prompt_feature) && row.contains(opt.completion_feature))
        format = Format::completions;
      else if (row.contains(opt.chat_feature))
        format = Format::chat;
      else if (row.contains(opt.text_feature))
        format = Format::text;
      else
        fail(where, "unsupported data format: expected '", opt.text_feature, "', '",
             opt.prompt_feature, "' and '", opt.completion_feature, "', or '", opt.chat_feature,
             "' keys (docs/training.md)");
      check(!(opt.mask_prompt && *format == Format::text), where,
            "--mask-prompt is not supported for a text dataset");
    }
    auto field = [&](const std::string& key, bool string) -> const chat::ojson& {
      check(row.contains(key), where, "row is missing '", key, "', which the ",
            format_name(*format), " format of this file needs");
      const auto& v = row.at(key);
      check(!string || v.is_string(), where, "'", key, "' must be a string, got ", v.type_name());
      return v;
    };
    Example ex;
    ex.keys = static_cast<int>(row.size());
    std::optional<chat::ojson> tools;
    if (row.contains("tools")) tools = row.at("tools");
    switch (*format) {
      case Format::text: {
        ex.tokens = codec.tokenizer->encode(field(opt.text_feature, true).get<std::string>());
        if (!eos) {
          const auto ids = codec.tokenizer->eos_token_ids();
          check(!ids.empty(), where, "the tokenizer has no eos_token, which text rows end with");
          eos = ids[0];
        }
        if (ex.tokens.empty() || ex.tokens.back() != *eos) ex.tokens.push_back(*eos);
        break;
      }
      case Format::completions: {
        chat::ojson messages = chat::ojson::array();
        messages.push_back({{"role", "user"}, {"content", field(opt.prompt_feature, true)}});
        messages.push_back(
            {{"role", "assistant"}, {"content", field(opt.completion_feature, true)}});
        ex.tokens = encode_chat(codec, messages, tools, false);
        if (opt.mask_prompt) {
          chat::ojson prompt = chat::ojson::array({messages[0]});
          ex.offset = static_cast<int>(encode_chat(codec, prompt, tools, true).size());
        }
        break;
      }
      case Format::chat: {
        const auto& messages = field(opt.chat_feature, false);
        check(messages.is_array() && !messages.empty(), where, "'", opt.chat_feature,
              "' must be a non-empty array of messages");
        ex.tokens = encode_chat(codec, messages, tools, false);
        if (opt.mask_prompt) {
          const auto& last = messages.back();
          const bool gen = last.is_object() && last.contains("role") && last["role"] == "assistant";
          chat::ojson prompt(messages.begin(), messages.end() - 1);
          if (prompt.is_null()) prompt = chat::ojson::array();
          ex.offset = static_cast<int>(encode_chat(codec, prompt, tools, gen).size());
        }
        break;
      }
      case Format::preference: {
        // Each answer as the assistant turn after the (system and) user prompt, as
        // CompletionsDataset renders a completion; the loss covers the answer only.
        chat::ojson prompt = chat::ojson::array();
        if (row.contains("system"))
          prompt.push_back({{"role", "system"}, {"content", field("system", true)}});
        prompt.push_back({{"role", "user"}, {"content", field(opt.prompt_feature, true)}});
        auto answer = [&](const char* key) {
          chat::ojson m = prompt;
          m.push_back({{"role", "assistant"}, {"content", field(key, true)}});
          return encode_chat(codec, m, tools, false);
        };
        ex.tokens = answer("chosen");
        ex.rejected = answer("rejected");
        ex.offset = static_cast<int>(encode_chat(codec, prompt, tools, true).size());
        check(static_cast<int>(std::min(ex.tokens.size(), ex.rejected.size())) > ex.offset, where,
              "the chosen and rejected answers must each add tokens after the prompt");
        break;
      }
    }
    check(!ex.tokens.empty(), where, "the row encodes to no tokens");
    out.rows.push_back(std::move(ex));
  }
  return out;
}

std::vector<int> NumpyRandom::permutation(int n) {
  std::vector<int> a(n);
  std::iota(a.begin(), a.end(), 0);
  for (int i = n - 1; i >= 1; --i) {
    // random_interval(i): the smallest all-ones mask covering i, redrawn while above i.
    uint32_t mask = static_cast<uint32_t>(i);
    for (int s : {1, 2, 4, 8, 16}) mask |= mask >> s;
    uint32_t v;
    do {
      v = static_cast<uint32_t>(mt_()) & mask;
    } while (v > static_cast<uint32_t>(i));
    std::swap(a[i], a[v]);
  }
  return a;
}

BatchIterator::BatchIterator(const Dataset& data, int batch_size, int max_seq_length, bool loop,
                             NumpyRandom& rng)
    : data_(data),
      batch_size_(batch_size),
      max_seq_length_(max_seq_length),
      loop_(loop),
      rng_(rng) {
  const int n = static_cast<int>(data.size());
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int a, int b) { return data.rows[a].keys < data.rows[b].keys; });
  for (int i = 0; i + batch_size <= n; i += batch_size)
    batches_.emplace_back(idx.begin() + i, idx.begin() + i + batch_size);
}

std::optional<Batch> BatchIterator::next() {
  // Checked on the first batch, as mlx-lm's generator does (a pass of 0 batches never asks).
  check(static_cast<int>(data_.size()) >= batch_size_, data_.source,
        "Dataset must have at least batch_size=", batch_size_, " examples but only has ",
        data_.size());
  if (!started_ || at_ == order_.size()) {
    if (started_ && !loop_) return std::nullopt;
    order_ = rng_.permutation(num_batches());
    at_ = 0;
    started_ = true;
  }
  const auto& rows = batches_[order_[at_++]];
  // A preference batch: the chosen sequences, then the rejected ones.
  std::vector<const std::vector<int>*> seqs;
  std::vector<int> offsets;
  for (int r : rows) {
    seqs.push_back(&data_.rows[r].tokens);
    offsets.push_back(data_.rows[r].offset);
  }
  if (data_.preference)
    for (int r : rows) {
      seqs.push_back(&data_.rows[r].rejected);
      offsets.push_back(data_.rows[r].offset);
    }
  const int n = static_cast<int>(seqs.size());
  int longest = 0;
  for (const auto* t : seqs) longest = std::max(longest, static_cast<int>(t->size()));
  if (longest > max_seq_length_)
    std::fprintf(stderr,
                 "[WARNING] Some sequences are longer than %d tokens. The longest sentence %d "
                 "will be truncated to %d. Consider pre-splitting your data to save memory.\n",
                 max_seq_length_, longest, max_seq_length_);
  constexpr int pad_to = 32;
  const int width = std::min(1 + pad_to * ((longest + pad_to - 1) / pad_to), max_seq_length_);
  std::vector<int32_t> tokens(static_cast<size_t>(n) * width, 0);
  std::vector<int32_t> lengths;
  for (int j = 0; j < n; ++j) {
    const std::vector<int>& t = *seqs[j];
    const int len = std::min(static_cast<int>(t.size()), max_seq_length_);
    std::copy(t.begin(), t.begin() + len, tokens.begin() + j * width);
    lengths.push_back(offsets[j]);
    lengths.push_back(len);
  }
  return Batch{mx::array(tokens.data(), {n, width}, mx::int32),
               mx::array(lengths.data(), {n, 2}, mx::int32)};
}

}  // namespace lmx::train
