// SentencePiece unigram encoding (Note [SentencePiece unigram], Note [SentencePiece
// normalization]) on models written here: the best segmentation and its ties, unknown characters
// joined or spelled as bytes, user-defined pieces, the whitespace switches, a damaged map. Ids equal
// to the `sentencepiece` package's on trained models: tests/python/test_tokenizers_parity.py.

#include "tandem/data/sp_unigram.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../error_of.h"

namespace tandem {
namespace {

using Ids = std::vector<int>;
const std::string kSp = "\xE2\x96\x81";  // U+2581

// <unk> 0, <s> 1, </s> 2, then the pieces given, ids from 3.
SpModelProto model(const std::vector<std::pair<std::string, float>>& pieces, bool bytes = false) {
  SpModelProto m;
  m.model_type = 1;
  m.pieces = {
      {"<unk>", 0, SpModelProto::kUnknown}, {"<s>", 0, SpModelProto::kControl}, {"</s>", 0, SpModelProto::kControl}};
  for (const auto& [p, score] : pieces) m.pieces.push_back({p, score, SpModelProto::kNormal});
  if (bytes) {
    m.byte_fallback = true;
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      m.pieces.push_back({name, 0, SpModelProto::kByte});
    }
  }
  return m;
}

Ids encode(const SpModelProto& m, const std::string& text) { return sp_unigram_for_model(m, "t.model")->encode(text); }

TEST(SpUnigram, TakesTheSegmentationOfTheHighestScore) {
  auto m = model({{kSp + "a", -1}, {"b", -2}, {kSp + "ab", -2.4f}, {"c", -3}, {"bc", -4.5}, {kSp, -5}});
  // "▁abc": ▁ab + c = -5.4 beats ▁a + bc = -5.5 and ▁a + b + c = -6
  EXPECT_EQ(encode(m, "abc"), (Ids{5, 6}));
  m.pieces[5].score = -2.6f;  // ▁ab + c = -5.6 < ▁a + bc = -5.5
  EXPECT_EQ(encode(m, "abc"), (Ids{3, 7}));
  EXPECT_EQ(encode(m, "ab b"), (Ids{5, 8, 4}));
}

TEST(SpUnigram, ATieKeepsThePathFoundFirst) {
  auto m = model({{"a", -1}, {"b", -1}, {"ab", -2}});
  m.add_dummy_prefix = false;
  EXPECT_EQ(encode(m, "ab"), (Ids{5}));  // ab (from position 0) before a + b (b found from 1)
}

TEST(SpUnigram, ConsecutiveUnknownCharactersAreOnePieceOrTheirBytes) {
  const auto m = model({{kSp + "a", -1}, {"a", -2}, {kSp, -3}});
  EXPECT_EQ(encode(m,
                   "a\xC3\xA9\xC3\xA9"
                   "a"),
            (Ids{3, 0, 4}));  // ▁a, éé as one <unk>, a
  EXPECT_EQ(encode(m, "a \xC3\xA9"), (Ids{3, 5, 0}));
  const auto b = model({{kSp + "a", -1}, {"a", -2}, {kSp, -3}}, true);
  const int byte0 = 6;  // <0x00>
  EXPECT_EQ(encode(b,
                   "a\xC3\xA9"
                   "a"),
            (Ids{3, byte0 + 0xC3, byte0 + 0xA9, 4}));
}

TEST(SpUnigram, AUserDefinedPieceIsAlwaysTakenWhole) {
  auto m = model({{kSp + "a", -1}, {"<", -2}, {"s", -2}, {">", -2}, {kSp, -3}});
  m.pieces.push_back({"<s>x", 0, SpModelProto::kUserDefined});  // 8
  EXPECT_EQ(encode(m, "a<s>x"), (Ids{3, 8}));
  EXPECT_EQ(encode(m, "a<s>"), (Ids{3, 4, 5, 6}));
}

// As libsentencepiece: the highest score starts at FLT_MIN, so a user-defined piece scores about
// -0.1 and beats even a split into two pieces of -1 each.
TEST(SpUnigram, AUserDefinedPieceBeatsItsSplits) {
  auto m = model({{"u", -1}, {"v", -1}});
  m.add_dummy_prefix = false;
  m.pieces.push_back({"uv", 0, SpModelProto::kUserDefined});  // 5
  EXPECT_EQ(encode(m, "uv"), (Ids{5}));
  EXPECT_EQ(encode(m, "vu"), (Ids{4, 3}));
}

// SentencePiece's UTF-8 decoding: a malformed character (overlong, a surrogate, a stray
// continuation byte) becomes U+FFFD one byte at a time; here unknown, spelled as its bytes.
TEST(SpUnigram, MalformedCharactersBecomeReplacementCharacters) {
  const auto m = model({{kSp + "a", -1}, {"a", -2}, {kSp, -3}}, true);
  const int byte0 = 6;
  const Ids fffd{byte0 + 0xEF, byte0 + 0xBF, byte0 + 0xBD};
  const auto times = [&](int n) {
    Ids out;
    for (int i = 0; i < n; ++i) out.insert(out.end(), fffd.begin(), fffd.end());
    return out;
  };
  const auto with = [&](Ids head, const Ids& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  EXPECT_EQ(encode(m, "a\xC0\x80"), with({3}, times(2)));                   // overlong
  EXPECT_EQ(encode(m, "a\xED\xA0\x80"), with({3}, times(3)));               // a surrogate
  EXPECT_EQ(encode(m, "a\xF4\x90\x80\x80"), with({3}, times(4)));           // beyond U+10FFFF
  EXPECT_EQ(encode(m, "a\xC3\xA9"), (Ids{3, byte0 + 0xC3, byte0 + 0xA9}));  // é, well formed
}

TEST(SpUnigram, WhitespaceIsCollapsedOrKeptAsTheModelSays) {
  auto m = model({{kSp + "a", -1}, {"a", -2}, {kSp, -3}});
  EXPECT_EQ(encode(m, "  a   a  "), (Ids{3, 3}));  // leading, repeated and trailing spaces dropped
  EXPECT_EQ(encode(m, "   "), Ids{});
  EXPECT_EQ(encode(m, ""), Ids{});
  m.remove_extra_whitespaces = false;
  EXPECT_EQ(encode(m, " a  a "), (Ids{5, 3, 5, 3, 5}));  // ▁ (dummy) ▁a ▁ ▁a ▁
  m.add_dummy_prefix = false;
  EXPECT_EQ(encode(m, "a a"), (Ids{4, 3}));
}

TEST(SpUnigram, OnlyUnigramModelsWithSpacesInFront) {
  auto m = model({{"a", -1}});
  m.model_type = 2;
  EXPECT_EQ(sp_unigram_for_model(m, "t.model"), nullptr);
  m.model_type = 1, m.treat_whitespace_as_suffix = true;
  EXPECT_EQ(sp_unigram_for_model(m, "t.model"), nullptr);
}

TEST(SpUnigram, ADamagedNormalizationIsNamed) {
  auto m = model({{"a", -1}});
  m.charsmap = std::string("\xFF\x00\x00\x00", 4) + "abcd";  // a trie of 255 bytes in 4
  const auto message = test::error_of([&] { sp_unigram_for_model(m, "t.model"); });
  EXPECT_NE(message.find("t.model: the compiled normalization's trie does not fit"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem
