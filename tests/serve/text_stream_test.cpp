// Note [Streaming text]: pieces never split a character or show the start of a stop string that
// then completes, and joined they equal the decoded text up to the first stop string.
#include "tandem/serve/text_stream.h"

#include <gtest/gtest.h>

#include "tandem/data/byte_tokenizer.h"

namespace tandem {
namespace {

struct Run {
  std::vector<std::string> pieces;
  std::string text;
  bool stopped = false;
};

Run stream(const std::string& bytes, std::vector<std::string> stops) {
  ByteTokenizer tok;
  TextStream s(tok, std::move(stops));
  Run r;
  for (const unsigned char c : bytes) {
    r.pieces.push_back(s.push(c));
    r.text += r.pieces.back();
  }
  r.pieces.push_back(s.flush());
  r.text += r.pieces.back();
  r.stopped = s.stopped();
  return r;
}

TEST(TextStream, NeverSplitsACharacter) {
  const std::string text = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z";  // a é € 😀 z
  const auto r = stream(text, {});
  EXPECT_EQ(r.text, text);
  for (const auto& p : r.pieces) EXPECT_EQ(utf8_complete_length(p), p.size()) << p;
  EXPECT_EQ(r.pieces[1], "");  // the first byte of é waits for the second
  EXPECT_EQ(r.pieces[2], "\xc3\xa9");
  EXPECT_FALSE(r.stopped);
}

TEST(TextStream, CutsAtTheFirstStopStringAndHoldsBackItsStart) {
  const auto r = stream("one two END three", {"END", "two E?"});
  EXPECT_EQ(r.text, "one two ");
  EXPECT_TRUE(r.stopped);
  std::string shown;
  for (const auto& p : r.pieces) {
    shown += p;
    EXPECT_EQ(shown.find('E'), std::string::npos) << "the start of END was shown before it completed";
  }
}

TEST(TextStream, ShowsAHeldBackPrefixWhenItDoesNotComplete) {
  const auto r = stream("an EN and no end", {"END"});
  EXPECT_EQ(r.text, "an EN and no end");
  EXPECT_FALSE(r.stopped);
  const auto tail = stream("ends with EN", {"END"});
  EXPECT_EQ(tail.pieces.back(), "EN");                     // flushed at the end
  EXPECT_EQ(stream("\xe2\x82", {}).text, "\xef\xbf\xbd");  // an unfinished character becomes U+FFFD
}

// A byte that begins no character, or a lead byte cut off by the next character, is shown as U+FFFD
// at once: every piece is well-formed.
TEST(TextStream, BytesThatFormNoCharacterShowAsReplacements) {
  const auto r = stream(
      "a\x80"
      "b\xc3"
      "z",
      {});
  EXPECT_EQ(r.text,
            "a\xef\xbf\xbd"
            "b\xef\xbf\xbdz");
  for (const auto& p : r.pieces) EXPECT_EQ(utf8_lossy(p), p) << p;
}

// Bytes as tokens 0..255 and one special token, 256, "<|eot|>".
class BytesWithASpecialToken : public Tokenizer {
 public:
  TokenizerKind kind() const override { return bytes_.kind(); }
  std::vector<TokenId> encode(std::string_view text, SpecialTokens special) const override {
    return bytes_.encode(text, special);
  }
  std::string decode(const std::vector<TokenId>& ids, SpecialTokens special) const override {
    return bytes_.decode(ids, special);
  }
  std::string token_bytes(TokenId id, TokenPlace place) const override {
    return id == 256 ? std::string("<|eot|>") : bytes_.token_bytes(id, place);
  }
  int64_t vocab_size() const override { return 257; }
  std::optional<TokenId> bos_id() const override { return std::nullopt; }
  std::optional<TokenId> eos_id() const override { return 256; }
  std::optional<TokenId> token_to_id(std::string_view token) const override { return bytes_.token_to_id(token); }
  std::string id_to_token(TokenId id) const override { return bytes_.id_to_token(id); }
  std::vector<SpecialToken> special_tokens() const override { return {{256, "<|eot|>"}}; }
  size_t piece_boundary(std::string_view text, size_t limit) const override {
    return bytes_.piece_boundary(text, limit);
  }
  std::string description() const override { return "bytes with <|eot|>"; }

 private:
  ByteTokenizer bytes_;
};

TEST(TextStream, SpecialTokensAreNotShown) {
  BytesWithASpecialToken tok;
  TextStream s(tok, {});
  std::string text;
  for (const TokenId t : {TokenId('h'), TokenId(256), TokenId('i')}) text += s.push(t);
  text += s.flush();
  EXPECT_EQ(text, "hi");
}

TEST(TextStream, AStopStringAcrossACharacterBoundary) {
  const auto r = stream("x\xc3\xa9y\xc3\xa9z", {"y\xc3\xa9"});
  EXPECT_EQ(r.text, "x\xc3\xa9");
  EXPECT_TRUE(r.stopped);
}

}  // namespace
}  // namespace tandem
