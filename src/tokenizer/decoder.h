// tokenizer.json "decoder": turns token strings back into text. Supported: ByteLevel, Metaspace,
// Replace, ByteFallback, Fuse, Strip, Sequence, and none (tokens joined by spaces).
//
// Every decoder is written as a streaming stage, so one implementation serves both decode() and
// the StreamingDetokenizer and the two agree by construction. Stages pass fragments of token
// strings down the chain; a fragment may be a whole token or part of one (after ByteLevel or
// Fuse the rest of the chain sees a single token growing piece by piece). Each stage holds back
// only what later input could still change: an incomplete UTF-8 sequence, a run of byte tokens,
// or trailing characters a Strip may remove.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_node.h"

namespace lmx::tok {

class DecodeSink {
 public:
  virtual ~DecodeSink() = default;
  // `begin`: the fragment starts a token; `end`: it completes it.
  virtual void push(std::string_view text, bool begin, bool end) = 0;
  // End of input: emit everything held back (closing any open token), then flush downstream.
  virtual void flush() = 0;
};

class DecoderStep {
 public:
  virtual ~DecoderStep() = default;
  // A fresh per-stream state forwarding to `next` (which must outlive it).
  virtual std::unique_ptr<DecodeSink> start(DecodeSink* next) const = 0;
};

class Decoder {
 public:
  // A null node gives `tokenizers`' default: tokens joined with single spaces.
  explicit Decoder(const Node& node);

  // The state chain for one stream of tokens, ending in `out`.
  struct Stream {
    std::vector<std::unique_ptr<DecodeSink>> stages;  // stages[0] receives the tokens
    DecodeSink* head() const { return stages.front().get(); }
  };
  Stream start(DecodeSink* out) const;

 private:
  std::vector<std::unique_ptr<DecoderStep>> steps_;
};

// Collects the final text.
class StringSink final : public DecodeSink {
 public:
  void push(std::string_view text, bool, bool) override { text_.append(text); }
  void flush() override {}
  std::string& text() { return text_; }

 private:
  std::string text_;
};

}  // namespace lmx::tok
