// tokenizer.json's normalizers (data/text_normalizer.h) one by one, as `tokenizers` applies them.

#include "tandem/data/text_normalizer.h"

#include <gtest/gtest.h>

#include <string>

#include "../error_of.h"

namespace tandem::detail {
namespace {

std::string normalized(const char* normalizer_json, std::string_view text) {
  const TextNormalizer n = TextNormalizer::parse(json::parse(normalizer_json), "test.json");
  std::string storage;
  return std::string(n.apply(text, storage));
}

TEST(TextNormalizer, NoneLeavesTheTextAsItIs) {
  const TextNormalizer n = TextNormalizer::parse(json(), "test.json");
  EXPECT_TRUE(n.empty());
  std::string storage;
  const std::string text = "a b";
  EXPECT_EQ(n.apply(text, storage).data(), text.data()) << "unchanged text is not copied";
}

TEST(TextNormalizer, PrependAndReplaceAsLlamaTwo) {
  // Llama 2's legacy conversion: a space before the text, every space as U+2581.
  const char* llama2 = R"({"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})";
  EXPECT_EQ(normalized(llama2, "Hello  world"), "\u2581Hello\u2581\u2581world");
  EXPECT_EQ(normalized(llama2, ""), "") << "Prepend leaves an empty text empty";
}

TEST(TextNormalizer, RegexReplaceAndNormalForms) {
  EXPECT_EQ(normalized(R"({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": "_"})", "a \t b\nc"), "a_b_c");
  EXPECT_EQ(normalized(R"({"type": "NFC"})", "e\u0301"), "\u00e9");
  EXPECT_EQ(normalized(R"({"type": "NFKC"})", "\uff21"), "A");
}

TEST(TextNormalizer, AKindTandemDoesNotReadIsNamed) {
  const std::string msg = test::error_of([] {
    TextNormalizer::parse(json::parse(R"({"type": "BertNormalizer", "lowercase": true})"), "bert.json");
  });
  EXPECT_NE(msg.find("bert.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("BertNormalizer"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tandem::detail
