#include "tokenizer/post_processor.h"

#include <string>
#include <utility>

namespace lmx::tok {

namespace {

// The ids before and after the sequence ($A) for a single input.
class Surround final : public PostProcessor {
 public:
  Surround(std::vector<int> before, std::vector<int> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int> before_, after_;
};

class NoOp final : public PostProcessor {
 public:
  void process(std::vector<int>&) const override {}
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void process(std::vector<int>& ids) const override {
    for (const auto& s : steps_) s->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> make_template(const Node& node) {
  Node special = node.get("special_tokens");
  auto special_ids = [&](const Node& where, const std::string& name) {
    if (!special.has(name)) {
      where.fail("special token \"", name, "\" is not listed in ", special.path());
    }
    Node ids = special.at(name).at("ids");
    std::vector<int> out;
    for (size_t i = 0; i < ids.size(); ++i) out.push_back(int(ids[i].as_int()));
    return out;
  };
  Node single = node.at("single");
  std::vector<int> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    Node item = single[i];
    if (item.has("Sequence")) {
      std::string id = item.at("Sequence").str("id");
      if (id != "A") item.fail("a single-sequence template can only hold $A, got $", id);
      if (seen_sequence) item.fail("expected $A once in the template, got it twice");
      seen_sequence = true;
    } else if (item.has("SpecialToken")) {
      std::vector<int> ids = special_ids(item, item.at("SpecialToken").str("id"));
      auto& dst = seen_sequence ? after : before;
      dst.insert(dst.end(), ids.begin(), ids.end());
    } else {
      item.fail("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, got ", item.raw().dump());
    }
  }
  if (!seen_sequence) single.fail("expected the template to contain $A, got none");
  return std::make_unique<Surround>(std::move(before), std::move(after));
}

// RobertaProcessing / BertProcessing: "cls": [token, id], "sep": [token, id].
std::unique_ptr<PostProcessor> make_cls_sep(const Node& node) {
  auto id_of = [&](std::string_view key) {
    Node pair = node.at(key);
    if (pair.size() != 2) pair.fail("expected [token, id], got ", pair.raw().dump());
    return int(pair[1].as_int());
  };
  return std::make_unique<Surround>(std::vector<int>{id_of("cls")}, std::vector<int>{id_of("sep")});
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const Node& node) {
  if (node.is_null()) return nullptr;
  std::string type = node.type();
  if (type == "TemplateProcessing") return make_template(node);
  if (type == "RobertaProcessing" || type == "BertProcessing") return make_cls_sep(node);
  if (type == "ByteLevel") return std::make_unique<NoOp>();
  if (type == "Sequence") {
    Node list = node.at("processors");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto p = make_post_processor(list[i])) steps.push_back(std::move(p));
    }
    return std::make_unique<SequenceProcessor>(std::move(steps));
  }
  node.unsupported("TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence");
}

}  // namespace lmx::tok
