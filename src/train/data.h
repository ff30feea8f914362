// Training data as mlx_lm.lora reads it (tuner/datasets.py, tuner/trainer.py iterate_batches):
// train / valid / test .jsonl files of `text`, `prompt`+`completion` or chat `messages` rows
// (with optional `tools`), tokenized the same way, batched in the same order from numpy's legacy
// global RNG (np.random.seed + np.random.permutation, reproduced on std::mt19937).
#pragma once

#include <mlx/mlx.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lmx::train {

namespace mx = mlx::core;
namespace fs = std::filesystem;

struct DataOptions {
  bool mask_prompt = false;
  std::string text_feature = "text";
  std::string prompt_feature = "prompt";
  std::string completion_feature = "completion";
  std::string chat_feature = "messages";
  // --train-mode dpo|orpo: every row is {"prompt", "chosen", "rejected"[, "system"]}.
  bool preference = false;
};

// One row: its tokens, where the loss starts (the prompt's length with --mask-prompt, else 0),
// and the row's number of JSON keys, which is what mlx-lm's CacheDataset.itemlen sorts by.
// Preference rows: `tokens` is the chosen answer's sequence, `rejected` the rejected one's, both
// after the same prompt of `offset` tokens.
struct Example {
  std::vector<int> tokens;
  int offset = 0;
  int keys = 0;
  std::vector<int> rejected;
};

struct Dataset {
  std::string source;  // the file, for messages
  std::vector<Example> rows;
  bool preference = false;
  size_t size() const { return rows.size(); }
};

// The model's tokenizer and its chat template (read only when a chat or completion file needs it).
struct TextCodec {
  const Tokenizer* tokenizer = nullptr;
  std::function<const chat::ChatTemplate&()> chat_template;
};

// Reads `file` (empty Dataset when it does not exist). The format is the first row's, as
// create_dataset picks it; every row must have that format's fields. Throws lmx::Error naming
// the file and line for malformed JSON or a missing field.
Dataset load_jsonl(const fs::path& file, const TextCodec& codec, const DataOptions& options);

// numpy's legacy RandomState: seed() as np.random.seed(int), permutation(n) as
// np.random.permutation(n) (Fisher-Yates with masked rejection sampling).
class NumpyRandom {
 public:
  explicit NumpyRandom(uint32_t seed) : mt_(seed) {}
  std::vector<int> permutation(int n);

 private:
  std::mt19937 mt_;
};

// A padded batch (batch_size, 1 + 32 * ceil(max_len / 32) capped at max_seq_length) int32 and
// the (offset, length) pairs, (batch_size, 2) int32. A preference batch has 2 * batch_size rows:
// the chosen sequences, then the rejected ones in the same order.
struct Batch {
  mx::array tokens{0};
  mx::array lengths{0};
};

// iterate_batches: rows sorted (stably) by key count, cut into full batches, the batches visited
// in a fresh permutation per epoch, drawn when the epoch starts. Sequences over max_seq_length
// are truncated with a warning on stderr, as mlx-lm does.
class BatchIterator {
 public:
  BatchIterator(const Dataset& data, int batch_size, int max_seq_length, bool loop,
                NumpyRandom& rng);
  // nullopt at the end of the data (never when looping).
  std::optional<Batch> next();
  int num_batches() const { return static_cast<int>(batches_.size()); }

 private:
  const Dataset& data_;
  int batch_size_, max_seq_length_;
  bool loop_;
  NumpyRandom& rng_;
  std::vector<std::vector<int>> batches_;
  std::vector<int> order_;
  size_t at_ = 0;
  bool started_ = false;
};

}  // namespace lmx::train
