// tokenizer.json "post_processor": adds the special tokens around a single encoded sequence when
// encode() is asked for special tokens. Supported: TemplateProcessing, RobertaProcessing,
// BertProcessing, ByteLevel (offsets only, so no-op here), Sequence.
#pragma once

#include <memory>
#include <vector>

#include "tokenizer/json_node.h"

namespace lmx::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int>& ids) const = 0;
};

// Null for a null/absent node.
std::unique_ptr<PostProcessor> make_post_processor(const Node& node);

}  // namespace lmx::tok
