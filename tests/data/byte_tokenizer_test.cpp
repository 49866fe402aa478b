// tandem's byte tokenizer (data/byte_tokenizer.h) at the edges of its contract: ids outside the 256
// bytes, one-byte token strings, no special tokens whatever encode is asked, and cuts anywhere.

#include "tandem/data/byte_tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

using Ids = std::vector<TokenId>;

TEST(ByteTokenizer, IdsOutsideTheBytesAreSkippedOrEmpty) {
  const ByteTokenizer t;
  EXPECT_EQ(t.decode({-1, 'a', 256, 'b', 1000, 'c'}), "abc");
  EXPECT_EQ(t.decode({}), "");
  EXPECT_EQ(t.token_bytes(-1), "");
  EXPECT_EQ(t.token_bytes(256), "");
  EXPECT_EQ(t.token_bytes(255), "\xFF");
  EXPECT_EQ(t.token_bytes(0), std::string(1, '\0'));
  EXPECT_EQ(t.token_bytes('x', TokenPlace::kFirst), "x");  // bytes have no leading space to drop
  EXPECT_EQ(t.id_to_token(256), "");
  EXPECT_EQ(t.id_to_token(-5), "");
  EXPECT_EQ(t.id_to_token(0x41), "A");
}

TEST(ByteTokenizer, ATokenIsExactlyOneByte) {
  const ByteTokenizer t;
  EXPECT_EQ(t.token_to_id("a"), 'a');
  EXPECT_EQ(t.token_to_id("\xFF"), 255);  // unsigned, not -1
  EXPECT_EQ(t.token_to_id(std::string(1, '\0')), 0);
  EXPECT_FALSE(t.token_to_id("").has_value());
  EXPECT_FALSE(t.token_to_id("ab").has_value());
  EXPECT_FALSE(t.token_to_id("\xC3\xA9").has_value());  // é is two bytes, two tokens
  for (int b = 0; b < 256; ++b) EXPECT_EQ(t.token_to_id(t.id_to_token(b)), b);
}

TEST(ByteTokenizer, NoSpecialTokensEvenWhenAskedFor) {
  const ByteTokenizer t;
  EXPECT_EQ(t.kind(), TokenizerKind::kByte);
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_TRUE(t.special_tokens().empty());
  EXPECT_EQ(t.encode("hi", SpecialTokens::kInclude), (Ids{'h', 'i'}));
  EXPECT_EQ(t.encode("hi", SpecialTokens::kOmit), (Ids{'h', 'i'}));
  // Text that looks like a special token is its bytes.
  EXPECT_EQ(t.encode("<s>").size(), 3u);
  EXPECT_EQ(t.decode({'<', '/', 's', '>'}, SpecialTokens::kOmit), "</s>");
  EXPECT_EQ(t.description(), "byte tokenizer: 256 tokens (one per byte), no BOS or EOS");
}

// Note [Document pieces]: bytes may be cut anywhere for their ids; the cut goes back to a
// character's start (up to 3 bytes) so no task counts half a character as malformed.
TEST(ByteTokenizer, PiecesAreCutAtACharactersStart) {
  const ByteTokenizer t;
  const std::string text = "caf\xC3\xA9 au lait";
  EXPECT_EQ(t.piece_boundary(text, 4), 3u) << "inside é: back to its first byte";
  EXPECT_EQ(t.piece_boundary(text, 5), 5u) << "after é";
  EXPECT_EQ(t.piece_boundary("\x80\x80\x80\x80\x80z", 4), 4u) << "no character start within 3 bytes: the limit";
  EXPECT_EQ(t.piece_boundary(text, 1), 1u);
  EXPECT_EQ(t.piece_boundary(text, 1000), text.size());
  EXPECT_EQ(t.piece_boundary("", 5), 0u);
  Ids parts = t.encode(text.substr(0, 4));
  const Ids rest = t.encode(text.substr(4));
  parts.insert(parts.end(), rest.begin(), rest.end());
  EXPECT_EQ(parts, t.encode(text));
}

}  // namespace
}  // namespace tandem
