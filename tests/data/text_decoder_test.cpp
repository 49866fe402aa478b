// tokenizer.json's decoder chain for text tokens (data/text_decoder.h): each step as `tokenizers`
// runs it, and the bytes a single token adds when a stream decodes token by token.

#include "tandem/data/text_decoder.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../error_of.h"

namespace tandem::detail {
namespace {

// Llama 2's decoder: U+2581 back to spaces, <0xXX> tokens to bytes, joined, the first space stripped.
const char* kLlama2 = R"({"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})";

TEST(TextDecoder, ReplaceByteFallbackFuseStrip) {
  const TextDecoder d = TextDecoder::parse(json::parse(kLlama2), "test.json");
  EXPECT_EQ(d.decode({"\u2581Hello", "\u2581wor", "ld"}), "Hello world");
  // U+00E9 as its two UTF-8 bytes, each a byte token.
  EXPECT_EQ(d.decode({"\u2581caf", "<0xC3>", "<0xA9>"}), "caf\u00e9");
  // A byte run that is not UTF-8 becomes one U+FFFD per token.
  EXPECT_EQ(d.decode({"\u2581a", "<0xC3>", "b"}), "a\ufffdb");
}

TEST(TextDecoder, TokenTextForStreaming) {
  const TextDecoder d = TextDecoder::parse(json::parse(kLlama2), "test.json");
  EXPECT_EQ(d.token_text("\u2581Hello", /*first=*/true), "Hello");
  EXPECT_EQ(d.token_text("\u2581Hello", /*first=*/false), " Hello");
  EXPECT_EQ(d.token_text("<0x0A>", false), "\n");
  EXPECT_EQ(byte_token_value("<0xFF>"), 255);
  EXPECT_EQ(byte_token_value("<0xG0>"), -1);
  EXPECT_EQ(byte_token_value("a"), -1);
}

TEST(TextDecoder, NoDecoderJoinsWithSpacesAndAnUnknownOneIsNamed) {
  EXPECT_EQ(TextDecoder::parse(json(), "test.json").decode({"a", "b"}), "a b");
  const std::string msg =
      test::error_of([] { TextDecoder::parse(json::parse(R"({"type": "WordPiece"})"), "wp.json"); });
  EXPECT_NE(msg.find("WordPiece"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tandem::detail
