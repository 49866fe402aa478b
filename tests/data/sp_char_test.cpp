// A SentencePiece char model encoded without the library (Note [SentencePiece char model]): one piece
// a character of the normalized text, pieces of several characters never used, a run of unseen
// characters one unknown piece or, with byte fallback, their bytes. tests/python/
// test_tokenizers_parity.py holds its ids to the sentencepiece package's on trained models.

#include "tandem/data/sp_char.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sp_model_bytes.h"

namespace tandem {
namespace {

using test::ModelBytes;

constexpr int kUnk = 0, kA = 259, kB = 260, kSpace = 261;
constexpr int byte_id(int b) { return 3 + b; }

std::unique_ptr<SpChar> char_model(ModelBytes m) {
  m.model_type = 4;
  return sp_char_for_model(parse_sp_model_proto(m.build(), "t.model"), "t.model");
}

TEST(SpChar, EachCharacterIsItsPieceAndLongerPiecesAreNotUsed) {
  const auto model = char_model({});
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->encode("ab a"), (std::vector<int>{kSpace, kA, kB, kSpace, kA}));
  EXPECT_TRUE(model->encode("").empty());
}

TEST(SpChar, UnseenCharactersAreTheirBytesOrOneUnknownPieceARun) {
  const auto bytes = char_model({});
  EXPECT_EQ(bytes->encode("a\xC3\xA9\xC3\xA9"),
            (std::vector<int>{kSpace, kA, byte_id(0xC3), byte_id(0xA9), byte_id(0xC3), byte_id(0xA9)}));
  ModelBytes plain;
  plain.byte_fallback = false;
  const auto unk = char_model(plain);
  EXPECT_EQ(unk->encode("a\xC3\xA9\xC3\xA9 b"), (std::vector<int>{kSpace, kA, kUnk, kSpace, kB}));
  EXPECT_EQ(unk->encode("\xC3\xA9" "a\xC3\xA9"), (std::vector<int>{kSpace, kUnk, kA, kUnk}));
}

TEST(SpChar, TheModelsNormalizationComesFirstAndOtherModelTypesAreNotChar) {
  ModelBytes collapsed;
  collapsed.normalizer = "nmt_nfkc";
  collapsed.remove_extra_whitespaces = true;
  EXPECT_EQ(char_model(collapsed)->encode("  a   b  "), (std::vector<int>{kSpace, kA, kSpace, kB}));
  EXPECT_EQ(sp_char_for_model(parse_sp_model_proto(ModelBytes{}.build(), "t.model"), "t.model"), nullptr);  // BPE
}

}  // namespace
}  // namespace tandem
