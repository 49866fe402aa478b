// A SentencePiece model's protobuf read from its bytes, and a BPE model read as SentencePiece-style
// BPE (Note [SentencePiece model as BPE]): the fields that decide it, merges ranked by the merged
// piece's score, the model's normalization first, unseen characters without byte fallback. tests/python/test_tokenizers_parity.py holds its ids
// to the sentencepiece package's on trained models.

#include "tandem/data/sp_model_bpe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../error_of.h"
#include "sp_model_bytes.h"

namespace tandem {
namespace {

using test::error_of;
using test::ModelBytes;
using test::kSp;
using Ids = std::vector<TokenId>;

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

// Models whose normalization is not identity are normalized first (Note [SentencePiece
// normalization]: here whitespace collapsed); without byte fallback a run of unseen characters is one
// unknown piece; a unigram model is not BPE.
TEST(SpModelBpe, EveryNormalizationAndUnknownCharactersWithoutByteFallback) {
  const auto bpe = [](const ModelBytes& m) { return sp_bpe_for_model(parse_sp_model_proto(m.build(), "t.model"), "t.model"); };
  ModelBytes collapsed;
  collapsed.normalizer = "nmt_nfkc";
  collapsed.remove_extra_whitespaces = true;
  EXPECT_EQ(bpe(collapsed)->encode("  a   b "), (Ids{kSpaceA, kSpace, kB}));
  EXPECT_EQ(bpe(ModelBytes{})->encode("  a"), (Ids{kSpace, kSpace, kSpaceA}));  // identity: spaces kept
  EXPECT_TRUE(bpe(collapsed)->encode("   ").empty());
  ModelBytes no_bytes;
  no_bytes.byte_fallback = false;
  EXPECT_EQ(bpe(no_bytes)->encode("a\xC3\xA9\xC3\xA9" "b"), (Ids{kSpaceA, 0, kB}));
  EXPECT_EQ(bpe(no_bytes)->encode("\xC3\xA9 \xC3\xA9"), (Ids{kSpace, 0, kSpace, 0}));
  ModelBytes unigram;
  unigram.model_type = 1;
  EXPECT_EQ(bpe(unigram), nullptr);
}

// Note [Words at space runs]: the text is cut before each run of spaces only where no piece joins a
// character to a space after it. A piece "a▁" (scored above "▁a") is such a join: merged over the
// whole text, "▁a▁b" becomes ▁ a▁ b, which cutting before the second ▁ would never give.
TEST(SpModelBpe, APieceWithASpaceAfterACharacterKeepsTheTextOneWord) {
  ModelBytes cut;
  EXPECT_EQ(sp_bpe_for_model(parse_sp_model_proto(cut.build(), "t.model"), "t.model")->encode("a b a"),
            (Ids{kSpaceA, kSpace, kB, kSpaceA}));
  ModelBytes joined;
  joined.extra = {{"a" + kSp, -0.5f}};
  const TokenId kAThenSpace = 266;
  EXPECT_EQ(sp_bpe_for_model(parse_sp_model_proto(joined.build(), "t.model"), "t.model")->encode("a b"),
            (Ids{kSpace, kAThenSpace, kB}));
}

TEST(SpModelBpe, BytesThatAreNotAModelAreRefusedNamingTheFile) {
  EXPECT_NE(error_of([] { parse_sp_model_proto("\xFF", "bad.model"); }).find("bad.model is not a SentencePiece model"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_sp_model_proto(std::string("\x0A\x7F", 2), "bad.model"); }).find("bad.model"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
