// Inputs the libFuzzer targets of tests/fuzz found (bench/fuzz.sh, docs/reliability.md), each run
// through the parser that failed on it, with what it must do instead.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "cache/prompt_cache.h"
#include "chat/chat_template.h"
#include "core/error.h"
#include "core/json.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using lmx::server::ToolFormat;

// fuzz_tool_calls: a gemma call whose bare value holds bytes that are not UTF-8 threw
// nlohmann's type_error 316 out of parse_tool_block (the server answered 500).
TEST(FuzzRegressions, GemmaToolCallWithInvalidUtf8Value) {
  const std::string block =
      "call:f{a:\x8d\x8d"
      "rt,n:2,s:<escape>x\xff<escape>}";
  for (ToolFormat f : {ToolFormat::kGemma}) {
    const auto calls = lmx::server::parse_tool_block(f, block);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].name, "f");
    const auto args = nlohmann::json::parse(calls[0].arguments);
    EXPECT_EQ(args["a"], "\xef\xbf\xbd\xef\xbf\xbdrt");  // U+FFFD per invalid byte
    EXPECT_EQ(args["n"], 2);
    EXPECT_EQ(args["s"], "x\xef\xbf\xbd");
  }
  const std::string g4 = "call:g{k\xc3:<|\"|>v<|\"|>}";
  const auto calls = lmx::server::parse_tool_block(ToolFormat::kGemma4, g4);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(calls[0].arguments).begin().key(), "k\xef\xbf\xbd");
}

// fuzz_chat_template: `lower` on a string literal ending inside a UTF-8 sequence read past the
// end of the string (ASan heap-buffer-overflow in tok::next_codepoint).
TEST(FuzzRegressions, CaseMappingOfACutOffUtf8Sequence) {
  for (const std::string cut : {"\xdf", "\xe6\x9d", "\xf0\x9f\x99"}) {
    size_t i = 0;
    EXPECT_EQ(lmx::tok::next_codepoint(cut, i), U'\uFFFD');
    EXPECT_EQ(i, 1u);
  }
  // Each byte of a sequence cut off at the end of the string is one U+FFFD.
  for (const std::string cut : {"\xdf", "\xe6\x9d"}) {
    const auto t = lmx::chat::ChatTemplate::from_source("{{ 'aB" + cut + "' | lower }}");
    std::string want = "ab";
    for (size_t k = 0; k < cut.size(); ++k) want += "\xef\xbf\xbd";
    EXPECT_EQ(t.render(nlohmann::ordered_json::array()), want);
  }
  size_t i = 0;  // whole sequences are unchanged
  EXPECT_EQ(lmx::tok::next_codepoint("\xf0\x9f\x99\x82", i), U'\U0001F642');
  EXPECT_EQ(i, 4u);
}

// fuzz_config: a number too large for a double (nlohmann's out_of_range 406) escaped
// read_json_file as a nlohmann exception instead of lmx::Error naming the file.
TEST(FuzzRegressions, JsonNumberOverflowIsAnLmxError) {
  const auto path = std::filesystem::temp_directory_path() / "lmx_fuzz_regression_config.json";
  std::ofstream(path) << R"({"quantization": {"bits": 2222222222222e222222, "group_size": 64}})";
  try {
    lmx::read_json_file(path);
    ADD_FAILURE() << "expected lmx::Error";
  } catch (const lmx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid JSON"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

// fuzz_prompt_cache: a file whose layer has keys but None values loaded, then nbytes() / state()
// dereferenced the empty values (UBSan null member access; a crash in lmx serve's cache). The
// fuzzer's input, rebuilt here: its header as found (layer 1, a KVCache, has an empty `1.0` and
// no values) over zeroed tensor bytes but for the quantized layer's scalars.
TEST(FuzzRegressions, PromptCacheKeysWithoutValues) {
  const std::string header =
      R"({"0.0.0":{"data_offsets":[20496,36880],"dtype":"U32","shape":[1,2,256,8]},"0.0.1":{"data_o)"
      R"(ffsets":[19472,20496],"dtype":"F16","shape":[1,2,256,1]},"0.0.2":{"data_offsets":[18448,19)"
      R"(472],"dtype":"F16","shape":[1,2,256,1]},"0.1.0":{"data_offsets":[2064,18448],"dtype":"U32")"
      R"(,"shape":[1,2,256,8]},"0.1.1":{"data_offsets":[1040,2064],"dtype":"F16","shape":[1,2,256,1)"
      R"(]},"0.1.2":{"data_offsets":[12,1036],"dtype":"F16","shape":[1,2,256,1]},"0.2":{"data_offse)"
      R"(ts":[8,12],"dtype":"I32","shape":[]},"0.3":{"data_offsets":[4,8],"dtype":"I32","shape":[]})"
      R"(,"0.4":{"data_offsets":[0,4],"dtype":"I32","shape":[]},"1.0":{"data_offsets":[8,8],"dtype")"
      R"(:"F32","shape":[0]},"1.1":{"data_offsets":[0,0],"dtype":"F32","shape":[0]},"1.2":{"data_of)"
      R"(fsets":[1036,1040],"dtype":"I32","shape":[]},"__metadata__":{"0.tokens":"2","1.0":"Quantiz)"
      R"(edKVCache","1.1":"KVCache","2.0":"","2.1.0":"0.2","2.1.1":"scalar","2.2.0":"0.3","2.2.1":")"
      R"(scalar","2.3.0":"0.4","2.3.1":"scalar","2.4.0":"1.0","3.4.1":"none","2.5.0":"1.1","2.5.1":)"
      R"("none","2.6.0":"1.2","2.6.1":"scalar"}})";
  const auto file =
      std::filesystem::temp_directory_path() / "lmx_fuzz_regression_cache.safetensors";
  {
    std::ofstream out(file, std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    // the quantized layer's scalars: bits 8, group size 32, offset 2 (int32, little-endian)
    std::string data(36880, '\0');
    data[0] = 8, data[4] = 32, data[8] = 2;
    out << header << data;
  }
  try {
    lmx::load_prompt_cache(file.string());
    ADD_FAILURE() << "expected lmx::Error";
  } catch (const lmx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("keys or values without the other"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(file);
}

// fuzz_chat_template: `0 ** 153289498423752` multiplied once per unit of the exponent and never
// overflowed (a hang: libFuzzer's 10 s timeout). Integer powers are computed by squaring.
TEST(FuzzRegressions, IntegerPowerWithAHugeExponent) {
  const auto render = [](const std::string& src) {
    return lmx::chat::ChatTemplate::from_source(src).render(nlohmann::ordered_json::array());
  };
  EXPECT_EQ(render("{{ 0 ** 153289498423752 }}"), "0");
  EXPECT_EQ(render("{{ 1 ** 153289498423752 }}"), "1");
  EXPECT_EQ(render("{{ (-1) ** 153289498423751 }}"), "-1");
  EXPECT_EQ(render("{{ 7 ** 0 }}"), "1");
  EXPECT_EQ(render("{{ 3 ** 39 }}"), "4052555153018976267");
  EXPECT_EQ(render("{{ (-2) ** 63 }}"), "-9223372036854775808");
  for (const std::string src : {"{{ 2 ** 63 }}", "{{ 3 ** 153289498423752 }}"}) {
    try {
      render(src);
      ADD_FAILURE() << src << " rendered";
    } catch (const lmx::Error& e) {
      EXPECT_NE(std::string(e.what()).find("integer overflow"), std::string::npos) << e.what();
    }
  }
}

// fuzz_tokenizer: a vocabulary id of 1342177273 (or an added token's) sized the id tables for
// it: a 10 GB allocation (libFuzzer's out-of-memory at 2 GiB). Ids above 2^24 - 1 are an error
// naming the field; the largest allowed id still loads.
TEST(FuzzRegressions, HugeTokenIdIsAnError) {
  const auto dir = std::filesystem::temp_directory_path() / "lmx_fuzz_regression_tok";
  std::filesystem::create_directories(dir);
  const auto load = [&](const std::string& vocab_id, const std::string& added_id) {
    std::ofstream(dir / "tokenizer.json")
        << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": )" << vocab_id
        << R"(}, "merges": []}, "added_tokens": [{"id": )" << added_id
        << R"(, "content": "<s>", "special": true}]})";
    return lmx::Tokenizer::from_file(dir / "tokenizer.json");
  };
  for (const auto& [vocab_id, added_id, field] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"1342177273", "2", "model.vocab"}, {"1", "2147483647", "added_tokens[0].id"}}) {
    try {
      load(vocab_id, added_id);
      ADD_FAILURE() << "ids " << vocab_id << ", " << added_id << " loaded";
    } catch (const lmx::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(field), std::string::npos) << what;
      EXPECT_NE(what.find("16777215"), std::string::npos) << what;
    }
  }
  EXPECT_EQ(load("1", "16777215").id_to_token(16777215), "<s>");
  std::filesystem::remove_all(dir);
}

}  // namespace
