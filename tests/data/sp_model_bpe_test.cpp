// A SentencePiece model's protobuf read from its bytes, and a BPE model read as SentencePiece-style
// BPE (Note [SentencePiece model as BPE]): the fields that decide it, the models it cannot stand
// for, merges ranked by the merged piece's score. tests/python/test_tokenizers_parity.py holds its ids
// to the sentencepiece package's on trained models.

#include "tandem/data/sp_model_bpe.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../error_of.h"

namespace tandem {
namespace {

using test::error_of;
using Ids = std::vector<TokenId>;

const std::string kSp = "\xE2\x96\x81";  // '▁' (U+2581)

// Protobuf's wire format, as the library writes a ModelProto.
std::string varint(uint64_t v) {
  std::string out;
  do {
    const auto b = static_cast<uint8_t>(v & 0x7F);
    v >>= 7;
    out.push_back(static_cast<char>(v ? b | 0x80 : b));
  } while (v);
  return out;
}
std::string field(int number, const std::string& bytes) {
  return varint(uint64_t(number) << 3 | 2) + varint(bytes.size()) + bytes;
}
std::string flag(int number, uint64_t v) { return varint(uint64_t(number) << 3) + varint(v); }
std::string piece(const std::string& text, float score, int type) {
  std::string f(4, '\0');
  std::memcpy(f.data(), &score, 4);
  return field(1, field(1, text) + varint(2 << 3 | 5) + f + flag(3, uint64_t(type)));
}

struct ModelBytes {
  int model_type = 2;
  bool byte_fallback = true, add_dummy_prefix = true, remove_extra_whitespaces = false;
  std::string normalizer = "identity";
  std::string build() const {
    // <unk> <s> </s>, the 256 byte pieces, then a, b, ▁, ▁a, ab, ▁ab (scores: later merges lower).
    std::string out = piece("<unk>", 0, 2) + piece("<s>", 0, 3) + piece("</s>", 0, 3);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      out += piece(name, 0, 6);
    }
    out += piece("a", -10, 1) + piece("b", -11, 1) + piece(kSp, -12, 1) + piece(kSp + "a", -1, 1) + piece("ab", -2, 1) +
           piece(kSp + "ab", -3, 1) + piece("<sep>", 0, 4);
    out += field(2, flag(3, uint64_t(model_type)) + flag(35, byte_fallback) + flag(24, 0));
    out += field(3, field(1, normalizer) + flag(3, add_dummy_prefix) + flag(4, remove_extra_whitespaces) + flag(5, 1));
    return out;
  }
};

constexpr TokenId kA = 259, kB = 260, kSpace = 261, kSpaceA = 262, kAB = 263, kSpaceAB = 264;

TEST(SpModelBpe, TheProtoFieldsThatDecideTheEncodingAreRead) {
  const SpModelProto m = parse_sp_model_proto(ModelBytes{}.build(), "t.model");
  ASSERT_EQ(m.pieces.size(), 3u + 256u + 7u);
  EXPECT_EQ(m.pieces[0].piece, "<unk>");
  EXPECT_EQ(m.pieces[0].type, SpModelProto::kUnknown);
  EXPECT_EQ(m.pieces[kSpaceA].piece, kSp + "a");
  EXPECT_FLOAT_EQ(m.pieces[kSpaceA].score, -1.0f);
  EXPECT_EQ(m.pieces.back().type, SpModelProto::kUserDefined);
  EXPECT_EQ(m.model_type, 2);
  EXPECT_TRUE(m.byte_fallback);
  EXPECT_EQ(m.normalizer_name, "identity");
  EXPECT_TRUE(m.add_dummy_prefix);
  EXPECT_FALSE(m.remove_extra_whitespaces);
  EXPECT_TRUE(m.escape_whitespaces);
}

TEST(SpModelBpe, MergesFollowTheMergedPiecesScores) {
  const auto bpe = sp_bpe_for_model(parse_sp_model_proto(ModelBytes{}.build(), "t.model"), "t.model");
  ASSERT_NE(bpe, nullptr);
  // "▁ab": ▁+a (score -1) before a+b (-2), then ▁a+b (-3) makes ▁ab.
  EXPECT_EQ(bpe->encode("ab"), (Ids{kSpaceAB}));
  EXPECT_EQ(bpe->encode("b a"), (Ids{kSpace, kB, kSpaceA}));
  EXPECT_EQ(bpe->encode("bab"), (Ids{kSpace, kB, kAB}));
  // An unseen character is its UTF-8 bytes (byte fallback): "é" is C3 A9.
  EXPECT_EQ(bpe->encode("\xC3\xA9"), (Ids{kSpace, 3 + 0xC3, 3 + 0xA9}));
  ModelBytes no_prefix;
  no_prefix.add_dummy_prefix = false;
  EXPECT_EQ(sp_bpe_for_model(parse_sp_model_proto(no_prefix.build(), "t.model"), "t.model")->encode("ab"), (Ids{kAB}));
}

TEST(SpModelBpe, ModelsItCannotStandForAreLeftToTheLibrary) {
  const auto none = [](ModelBytes m) {
    return sp_bpe_for_model(parse_sp_model_proto(m.build(), "t.model"), "t.model") == nullptr;
  };
  ModelBytes unigram, nfkc, collapsed, no_bytes;
  unigram.model_type = 1;
  nfkc.normalizer = "nmt_nfkc";
  collapsed.remove_extra_whitespaces = true;
  no_bytes.byte_fallback = false;
  EXPECT_TRUE(none(unigram));
  EXPECT_TRUE(none(nfkc));
  EXPECT_TRUE(none(collapsed));
  EXPECT_TRUE(none(no_bytes));
  EXPECT_FALSE(none(ModelBytes{}));
}

TEST(SpModelBpe, BytesThatAreNotAModelAreRefusedNamingTheFile) {
  EXPECT_NE(error_of([] { parse_sp_model_proto("\xFF", "bad.model"); }).find("bad.model is not a SentencePiece model"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_sp_model_proto(std::string("\x0A\x7F", 2), "bad.model"); }).find("bad.model"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
