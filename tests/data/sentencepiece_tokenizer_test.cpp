// SentencePiece models (data/sentencepiece_tokenizer.h) on a tokenizer.model written here field by
// field: the template's BOS/EOS and names overriding them, streamed bytes that add up to decode,
// byte fallback, ids outside the vocabulary, a file that is not a model.

#include "tandem/data/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"

namespace tandem {
namespace {

using test::error_of;
using Ids = std::vector<TokenId>;

// Protocol buffer wire format, enough for sentencepiece_model.proto's ModelProto.
struct Proto {
  std::string bytes;
  void varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) bytes.push_back(static_cast<char>((v & 0x7F) | 0x80));
    bytes.push_back(static_cast<char>(v));
  }
  void key(int field, int wire_type) { varint((uint64_t(field) << 3) | uint64_t(wire_type)); }
  Proto& integer(int field, uint64_t v) {
    key(field, 0);
    varint(v);
    return *this;
  }
  Proto& text(int field, const std::string& s) {
    key(field, 2);
    varint(s.size());
    bytes += s;
    return *this;
  }
  Proto& message(int field, const Proto& m) { return text(field, m.bytes); }
  Proto& real(int field, float f) {
    key(field, 5);
    char b[4];
    std::memcpy(b, &f, 4);
    bytes.append(b, 4);
    return *this;
  }
};

// ModelProto.SentencePiece.Type
enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6 };

const std::string kSp = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// A BPE model: <unk> 0, <s> 1, </s> 2, then "▁a" 3, "ab" 4, "▁ab" 5, "bc" 6, "▁c" 7, "a" 8, "b" 9,
// "c" 10, "▁" 11 (merged pieces score higher), then with `bytes` <0x00> .. <0xFF> as 12 .. 267.
// The normalizer adds the dummy prefix (a space before the text) and collapses runs of spaces.
void write_model(const std::string& path, bool bytes) {
  Proto model;
  const auto piece = [&](const std::string& p, float score, PieceType type) {
    Proto m;
    m.text(1, p).real(2, score).integer(3, type);
    model.message(1, m);
  };
  piece("<unk>", 0, kUnknown);
  piece("<s>", 0, kControl);
  piece("</s>", 0, kControl);
  float score = -1;
  for (const std::string& p : {kSp + "a", std::string("ab"), kSp + "ab", std::string("bc"), kSp + "c", std::string("a"),
                               std::string("b"), std::string("c"), kSp})
    piece(p, score--, kNormal);
  if (bytes)
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      piece(name, 0, kByte);
    }
  Proto trainer;  // TrainerSpec: model_type BPE (2), vocab_size, byte_fallback
  trainer.integer(3, 2).integer(4, bytes ? 268 : 12);
  if (bytes) trainer.integer(35, 1);
  Proto normalizer;  // NormalizerSpec: identity, add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces
  normalizer.text(1, "identity").integer(3, 1).integer(4, 1).integer(5, 1);
  model.message(2, trainer).message(3, normalizer);
  std::ofstream(path, std::ios::binary) << model.bytes;
}

class SentencePieceTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!SentencePieceTokenizer::available()) GTEST_SKIP() << "built without SentencePiece";
    write_model(dir_.file("plain.model"), false);
    write_model(dir_.file("bytes.model"), true);
  }
  std::string plain() const { return dir_.file("plain.model"); }
  std::string bytes() const { return dir_.file("bytes.model"); }
  test::TempDir dir_;
};

// What a streaming client shows: the first non-control token at kFirst, the rest at kFollowing.
std::string streamed(const Tokenizer& t, const Ids& ids) {
  std::string out;
  bool first = true;
  for (TokenId id : ids) {
    const bool control = t.token_bytes(id).empty();
    out += t.token_bytes(id, first && !control ? TokenPlace::kFirst : TokenPlace::kFollowing);
    if (!control) first = false;
  }
  return out;
}

TEST_F(SentencePieceTokenizerTest, EncodesWithTheModelsPiecesAndItsDummyPrefix) {
  const auto t = SentencePieceTokenizer::from_file(plain());
  EXPECT_EQ(t->kind(), TokenizerKind::kSentencePiece);
  EXPECT_EQ(t->vocab_size(), 12);
  EXPECT_EQ(t->encode("ab"), (Ids{5}));  // "▁ab": the dummy prefix's space and both letters
  EXPECT_EQ(t->encode("abc"), (Ids{5, 10}));
  EXPECT_EQ(t->encode("cab"), (Ids{7, 4}));
  EXPECT_EQ(t->encode("ab  c"), (Ids{5, 7}));        // runs of spaces collapse
  EXPECT_EQ(t->decode({5, 7}), "ab c");              // the dummy prefix's space is dropped again
  EXPECT_EQ(t->piece_boundary("ab\nAb\nc", 7), 0u);  // never: each piece would get a dummy prefix
}

TEST_F(SentencePieceTokenizerTest, TheTemplateAddsBosAndEosAsTheConfigurationSays) {
  const auto bos_only = SentencePieceTokenizer::from_file(plain());
  EXPECT_EQ(bos_only->bos_id(), 1);
  EXPECT_EQ(bos_only->eos_id(), 2);
  EXPECT_EQ(bos_only->encode("ab", SpecialTokens::kInclude), (Ids{1, 5}));
  EXPECT_EQ(bos_only->encode("ab", SpecialTokens::kOmit), (Ids{5}));
  const auto both = SentencePieceTokenizer::from_file(plain(), {}, {true, true});
  EXPECT_EQ(both->encode("ab", SpecialTokens::kInclude), (Ids{1, 5, 2}));
  const auto neither = SentencePieceTokenizer::from_file(plain(), {}, {false, false});
  EXPECT_EQ(neither->encode("ab", SpecialTokens::kInclude), (Ids{5}));
  // Control tokens are never rendered, whatever decode is asked.
  EXPECT_EQ(both->decode({1, 5, 2}, SpecialTokens::kInclude), "ab");
  const auto specials = both->special_tokens();
  ASSERT_EQ(specials.size(), 2u);
  EXPECT_EQ(specials[0].id, 1);
  EXPECT_EQ(specials[0].text, "<s>");
  EXPECT_EQ(specials[1].text, "</s>");
}

TEST_F(SentencePieceTokenizerTest, NamesGivenOverrideTheModelsBosAndEos) {
  const auto t =
      SentencePieceTokenizer::from_file(plain(), {std::string("</s>"), std::string(kSp + "c")}, {true, true});
  EXPECT_EQ(t->bos_id(), 2);
  EXPECT_EQ(t->eos_id(), 7);
  EXPECT_EQ(t->encode("ab", SpecialTokens::kInclude), (Ids{2, 5, 7}));
  EXPECT_EQ(t->description(), "SentencePiece from " + plain() + ": 12 tokens, BOS '</s>' (2), EOS '" + kSp + "c' (7)");
  const std::string message = error_of([&] {
    SentencePieceTokenizer::from_file(plain(), {std::nullopt, std::string("<eot>")});
  });
  EXPECT_NE(message.find("SentencePiece model '" + plain() + "' has no piece '<eot>'"), std::string::npos) << message;
}

TEST_F(SentencePieceTokenizerTest, PiecesAreLookedUpExactly) {
  const auto t = SentencePieceTokenizer::from_file(plain());
  EXPECT_EQ(t->token_to_id(kSp + "ab"), 5);
  EXPECT_EQ(t->token_to_id("<unk>"), 0);
  EXPECT_FALSE(t->token_to_id("zzz").has_value());  // the library answers <unk>'s id; that is not a match
  EXPECT_FALSE(t->token_to_id("").has_value());
  EXPECT_EQ(t->id_to_token(4), "ab");
  EXPECT_EQ(t->id_to_token(12), "");
  EXPECT_EQ(t->id_to_token(-1), "");
}

TEST_F(SentencePieceTokenizerTest, StreamedBytesAddUpToDecode) {
  const auto t = SentencePieceTokenizer::from_file(plain());
  EXPECT_EQ(t->token_bytes(5, TokenPlace::kFirst), "ab");  // the first piece's space is dropped
  EXPECT_EQ(t->token_bytes(5, TokenPlace::kFollowing), " ab");
  EXPECT_EQ(t->token_bytes(4, TokenPlace::kFirst), "ab");
  EXPECT_EQ(t->token_bytes(1), "");                // control
  EXPECT_EQ(t->token_bytes(0), " \xE2\x81\x87 ");  // <unk> as SentencePiece shows it
  EXPECT_EQ(t->token_bytes(12), "");
  EXPECT_EQ(t->token_bytes(-1), "");
  for (const std::string text : {"ab", "cab abc", "c  ab", "xab"}) {
    const Ids ids = t->encode(text, SpecialTokens::kInclude);
    EXPECT_EQ(streamed(*t, ids), t->decode(ids)) << text;
  }
  EXPECT_EQ(t->decode({5, 0}), "ab \xE2\x81\x87 ");    // 'é' unknown without byte pieces
  EXPECT_EQ(t->decode({5, -1, 12, 1000, 7}), "ab c");  // ids outside the vocabulary skipped
}

TEST_F(SentencePieceTokenizerTest, ByteFallbackSpellsUnknownCharactersByTheirBytes) {
  const auto t = SentencePieceTokenizer::from_file(bytes());
  EXPECT_EQ(t->vocab_size(), 268);
  const Ids ids = t->encode("ab\xC3\xA9");  // "abé"
  EXPECT_EQ(ids, (Ids{5, 12 + 0xC3, 12 + 0xA9}));
  EXPECT_EQ(t->token_bytes(12 + 0xC3), "\xC3");
  EXPECT_EQ(t->token_bytes(12 + 0x00), std::string(1, '\0'));
  EXPECT_EQ(t->id_to_token(12 + 0xA9), "<0xA9>");
  EXPECT_EQ(t->decode(ids), "ab\xC3\xA9");
  EXPECT_EQ(streamed(*t, ids), "ab\xC3\xA9");
  // Byte pieces are neither control tokens nor the first piece's space.
  EXPECT_EQ(t->special_tokens().size(), 2u);
  EXPECT_EQ(t->token_bytes(12 + 'x', TokenPlace::kFirst), "x");
}

TEST(SentencePieceTokenizer, AFileThatIsNotAModelIsRefusedByName) {
  test::TempDir dir;
  std::ofstream(dir.file("tokenizer.model")) << "{\"not\": \"a protobuf\"}";
  const std::string message = error_of([&] { SentencePieceTokenizer::from_file(dir.file("tokenizer.model")); });
  if (SentencePieceTokenizer::available()) {
    EXPECT_NE(message.find("cannot read SentencePiece model '" + dir.file("tokenizer.model") + "'"), std::string::npos)
        << message;
    EXPECT_NE(message.find("give a tokenizer.model written by SentencePiece"), std::string::npos) << message;
    EXPECT_NE(error_of([&] { SentencePieceTokenizer::from_file(dir.file("missing.model")); }).find("missing.model"),
              std::string::npos);
  } else {
    EXPECT_NE(message.find("built without SentencePiece; install libsentencepiece-dev"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace tandem
