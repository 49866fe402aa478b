// Byte-level BPE (data/bpe_tokenizer.h) beyond tokenizer_test.cpp: GPT-2's alphabet for unprintable
// bytes, unk_token, add_prefix_space, ids outside the vocabulary, BOS/EOS names, where a document
// may be cut (Note [Document pieces]) and the parts of a tokenizer.json it refuses.

#include "tandem/data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using test::error_of;
using Ids = std::vector<TokenId>;

const std::string kSpace = "\xC4\xA0";  // 'Ġ' U+0120: byte 0x20
const std::string kBreak = "\xC4\x8A";  // 'Ċ' U+010A: byte 0x0A

json byte_level_pre(bool prefix_space = false) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", prefix_space}, {"use_regex", true}};
}

// A tokenizer.json of `vocab` and `merges`, GPT-2's layout.
json tokenizer_json(json vocab, json merges = json::array(), json added = json::array(), json pre = byte_level_pre()) {
  return {{"version", "1.0"},
          {"added_tokens", std::move(added)},
          {"normalizer", nullptr},
          {"pre_tokenizer", std::move(pre)},
          {"post_processor", {{"type", "ByteLevel"}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}}}};
}

json added_token(TokenId id, const std::string& content, bool special) {
  return {{"id", id}, {"content", content}, {"special", special}, {"normalized", false}};
}

std::unique_ptr<BpeTokenizer> bpe(const json& j, const SpecialTokenNames& names = {}) {
  return BpeTokenizer::from_json(j.dump(), "fixture.json", names);
}

// GPT-2's alphabet: printable Latin-1 bytes stand for themselves, the 68 others for U+0100 onwards
// in byte order (0x00 -> U+0100, 0x20 -> U+0120, 0x7F -> U+0121, 0x80 -> U+0122, 0xAD -> U+0143).
TEST(BpeTokenizer, BytesThatAreNotPrintableHaveTheirGpt2Characters) {
  const json vocab = {{"\xC4\x80", 0},  // U+0100: byte 0x00
                      {"\xC4\xA1", 1},  // U+0121: byte 0x7F
                      {"\xC4\xA2", 2},  // U+0122: byte 0x80
                      {"\xC5\x83", 3},  // U+0143: byte 0xAD
                      {"\xC3\x83", 4},  // U+00C3 'Ã': byte 0xC3, printable, itself
                      {"\xC2\xA1", 5},  // U+00A1 '¡': byte 0xA1, itself
                      {"a", 6},        {kSpace, 7}, {kBreak, 8}};
  const auto t = bpe(tokenizer_json(vocab));
  EXPECT_EQ(t->encode(std::string(1, '\0')), (Ids{0}));
  EXPECT_EQ(t->encode("\x7F"), (Ids{1}));
  EXPECT_EQ(t->encode("\xC3\xAD"), (Ids{4, 3}));  // 'í' is C3 AD
  EXPECT_EQ(t->encode("\xC3\x80"), (Ids{4, 2}));  // 'À' is C3 80
  EXPECT_EQ(t->encode("a a\n"), (Ids{6, 7, 6, 8}));
  EXPECT_EQ(t->token_bytes(0), std::string(1, '\0'));
  EXPECT_EQ(t->token_bytes(3), "\xAD");
  EXPECT_EQ(t->token_bytes(5), "\xA1");
  EXPECT_EQ(t->decode({4, 3, 7, 4, 2}), "\xC3\xAD \xC3\x80");
  EXPECT_EQ(t->decode({3}), "\xEF\xBF\xBD");  // a lone continuation byte: U+FFFD
  EXPECT_EQ(t->id_to_token(3), "\xC5\x83");   // the stored form, not the byte
  EXPECT_EQ(t->token_to_id("\xC5\x83"), 3);
  EXPECT_FALSE(t->token_to_id("\xAD").has_value());
}

TEST(BpeTokenizer, BytesWithoutATokenBecomeTheUnknownTokenWhenThereIsOne) {
  const json vocab = {{"a", 0}, {"b", 1}, {"ab", 2}, {"<unk>", 3}};
  json with_unk = tokenizer_json(vocab, json::array({"a b"}));
  with_unk["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(bpe(with_unk)->encode("azb"), (Ids{0, 3, 1}));
  EXPECT_EQ(bpe(with_unk)->encode("abz"), (Ids{2, 3}));
  // Without unk_token (or naming a token the vocabulary lacks) they are dropped, as `tokenizers` does.
  EXPECT_EQ(bpe(tokenizer_json(vocab, json::array({"a b"})))->encode("azb"), (Ids{2}));
  with_unk["model"]["unk_token"] = "<missing>";
  EXPECT_EQ(bpe(with_unk)->encode("azb"), (Ids{2}));
}

TEST(BpeTokenizer, AddPrefixSpaceGivesEveryPieceOneLeadingSpace) {
  const json vocab = {{"a", 0}, {"b", 1}, {kSpace, 2}, {"ab", 3}, {kSpace + "ab", 4}, {kSpace + "a", 5}};
  const json merges = json::array({"a b", kSpace + " ab", kSpace + " a"});
  const auto plain = bpe(tokenizer_json(vocab, merges));
  const auto prefixed = bpe(tokenizer_json(vocab, merges, json::array(), byte_level_pre(true)));
  EXPECT_EQ(plain->encode("ab"), (Ids{3}));
  EXPECT_EQ(prefixed->encode("ab"), (Ids{4}));
  EXPECT_EQ(prefixed->encode(" ab"), (Ids{4}));  // a piece that has its space gets no second one
  EXPECT_EQ(prefixed->encode("ab ab"), (Ids{4, 4}));
  EXPECT_EQ(prefixed->decode(prefixed->encode("ab")), " ab");
}

TEST(BpeTokenizer, IdsOutsideTheVocabularyAreSkippedAndSpecialsOmittedOnRequest) {
  const json vocab = {{"a", 0}, {"b", 1}, {kSpace, 2}};
  const json added = json::array({added_token(5, "<|endoftext|>", true), added_token(6, "<m x>", false)});
  const auto t = bpe(tokenizer_json(vocab, json::array(), added));
  EXPECT_EQ(t->vocab_size(), 7);  // ids 3 and 4 are unused
  EXPECT_EQ(t->decode({0, -1, 3, 4, 7, 1000, 1}), "ab");
  EXPECT_EQ(t->token_bytes(4), "");
  EXPECT_EQ(t->token_bytes(7), "");
  EXPECT_EQ(t->token_bytes(-3), "");
  EXPECT_EQ(t->id_to_token(4), "");
  EXPECT_EQ(t->id_to_token(7), "");
  // An added token with a character outside the byte alphabet (the plain space) decodes as its text.
  EXPECT_EQ(t->encode("a<m x>b"), (Ids{0, 6, 1}));
  EXPECT_EQ(t->decode({0, 6, 1}), "a<m x>b");
  EXPECT_EQ(t->token_bytes(6), "<m x>");
  // kOmit leaves out the special tokens only; an added token that is not special stays.
  EXPECT_EQ(t->decode({0, 5, 6, 1}, SpecialTokens::kOmit), "a<m x>b");
  EXPECT_EQ(t->decode({0, 5, 6, 1}, SpecialTokens::kInclude), "a<|endoftext|><m x>b");
  const auto specials = t->special_tokens();
  ASSERT_EQ(specials.size(), 1u);
  EXPECT_EQ(specials[0].id, 5);
}

TEST(BpeTokenizer, BosAndEosComeFromTheNamesGivenElseTheUsualOnes) {
  const json vocab = {{"a", 0}};
  const json added = json::array({added_token(1, "<s>", true), added_token(2, "</s>", true),
                                  added_token(3, "<|im_end|>", true), added_token(4, "<|sep|>", true)});
  const json j = tokenizer_json(vocab, json::array(), added);
  const auto usual = bpe(j);
  EXPECT_EQ(usual->bos_id(), 1);
  EXPECT_EQ(usual->eos_id(), 2);  // </s> comes before <|im_end|> among the usual names
  EXPECT_EQ(usual->description(),
            "byte-level BPE from fixture.json: 5 tokens (4 added), BOS '<s>' (1), EOS '</s>' (2)");
  const auto named = bpe(j, {std::string("<|sep|>"), std::string("<|im_end|>")});
  EXPECT_EQ(named->bos_id(), 4);
  EXPECT_EQ(named->eos_id(), 3);
  EXPECT_EQ(named->encode("a", SpecialTokens::kInclude), (Ids{0}));  // BOS names do not add a template
  const std::string missing = error_of([&] { bpe(j, {std::nullopt, std::string("<|eot|>")}); });
  EXPECT_NE(missing.find("fixture.json has no token '<|eot|>', which the EOS setting names"), std::string::npos)
      << missing;
  const auto none = bpe(tokenizer_json(vocab));
  EXPECT_FALSE(none->bos_id().has_value());
  EXPECT_FALSE(none->eos_id().has_value());
  EXPECT_EQ(none->description(), "byte-level BPE from fixture.json: 1 tokens (0 added), BOS none, EOS none");
}

TEST(BpeTokenizer, ReadsAFileAndNamesAMissingOne) {
  test::TempDir dir;
  std::ofstream(dir.file("tokenizer.json")) << tokenizer_json({{"a", 0}, {"b", 1}, {"ab", 2}}, {"a b"}).dump();
  const auto t = BpeTokenizer::from_file(dir.file("tokenizer.json"));
  EXPECT_EQ(t->encode("abba"), (Ids{2, 1, 0}));
  EXPECT_NE(t->description().find(dir.file("tokenizer.json")), std::string::npos);
  EXPECT_NE(error_of([&] { BpeTokenizer::from_file(dir.file("missing.json")); }).find(dir.file("missing.json")),
            std::string::npos);
}

// Note [Document pieces]: a cut only after a line break that follows a printable ASCII character and
// precedes an ASCII letter, and only for tokenizers whose pieces are the same apart and whole.
TEST(BpeTokenizer, DocumentsAreCutOnlyWhereThePiecesEncodeAsTheWhole) {
  const json vocab = {{"a", 0}, {"B", 1}, {kBreak, 2}, {kSpace, 3}, {"9", 4}};
  const auto t = bpe(tokenizer_json(vocab));
  EXPECT_EQ(t->piece_boundary("a\nB", 100), 2u);  // the limit is clipped to the text
  EXPECT_EQ(t->piece_boundary("a\nB", 2), 2u);
  EXPECT_EQ(t->piece_boundary("a\nB", 1), 0u);         // nothing at or before the limit
  EXPECT_EQ(t->piece_boundary("9\na", 3), 2u);         // a digit before the break will do
  EXPECT_EQ(t->piece_boundary("a\n9", 3), 0u);         // a digit after it will not
  EXPECT_EQ(t->piece_boundary("a\n\nB", 4), 0u);       // two breaks: GPT-2's \s+(?!\S) differs at the end
  EXPECT_EQ(t->piece_boundary("a \nB", 4), 0u);        // nor a space before the break
  EXPECT_EQ(t->piece_boundary("\xC3\xA9\nB", 4), 0u);  // nor a character outside ASCII
  EXPECT_EQ(t->piece_boundary("", 10), 0u);
  EXPECT_EQ(t->piece_boundary("a\nBa\nB", 6), 5u);  // the last cut at or before the limit
  // Tokenizers whose parts would not encode as the whole never cut.
  for (const json& added : {json::array({added_token(9, "x\ny", false)}),
                            json::array({{{"id", 9}, {"content", "<m>"}, {"lstrip", true}, {"normalized", false}}})})
    EXPECT_EQ(bpe(tokenizer_json(vocab, json::array(), added))->piece_boundary("a\nB", 3), 0u) << added.dump();
  json no_regex = byte_level_pre();
  no_regex["use_regex"] = false;  // no splitting at all
  EXPECT_EQ(bpe(tokenizer_json(vocab, json::array(), json::array(), no_regex))->piece_boundary("a\nB", 3), 0u);
}

TEST(BpeTokenizer, PartsItDoesNotReadAreRefusedByName) {
  const json vocab = {{"a", 0}, {"b", 1}};
  const auto refusal = [](const json& j) { return error_of([&] { bpe(j); }); };
  json prefix = tokenizer_json(vocab);
  prefix["model"]["continuing_subword_prefix"] = "##";
  EXPECT_NE(refusal(prefix).find("model.continuing_subword_prefix is set"), std::string::npos);
  json suffix = tokenizer_json(vocab);
  suffix["model"]["end_of_word_suffix"] = "</w>";
  EXPECT_NE(refusal(suffix).find("model.end_of_word_suffix is set"), std::string::npos);
  for (const json& unset : {json(nullptr), json("")}) {  // as `tokenizers` writes them when unused
    json j = tokenizer_json(vocab);
    j["model"]["continuing_subword_prefix"] = unset;
    j["model"]["end_of_word_suffix"] = unset;
    EXPECT_EQ(refusal(j), "") << unset.dump();
  }
  EXPECT_NE(refusal(tokenizer_json(json::object())).find("fixture.json has an empty vocabulary"), std::string::npos);
  json decoder = tokenizer_json(vocab);
  decoder["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(refusal(decoder).find("decoder 'WordPiece' is not ByteLevel"), std::string::npos);
  decoder["decoder"] = nullptr;
  EXPECT_NE(refusal(decoder).find("decoder 'none' is not ByteLevel"), std::string::npos);
  decoder["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteLevel"}}})}};
  EXPECT_EQ(refusal(decoder), "");
  json whitespace = tokenizer_json(
      vocab, json::array(), json::array(),
      {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "Whitespace"}}, byte_level_pre()})}});
  EXPECT_NE(refusal(whitespace).find("pre-tokenizer 'Whitespace' is not read by tandem"), std::string::npos);
  json twice =
      tokenizer_json(vocab, json::array(), json::array(),
                     {{"type", "Sequence"}, {"pretokenizers", json::array({byte_level_pre(), byte_level_pre()})}});
  EXPECT_NE(refusal(twice).find("ByteLevel must be the last pre-tokenizer"), std::string::npos);
  json none = tokenizer_json(vocab);
  none["pre_tokenizer"] = nullptr;
  EXPECT_NE(refusal(none).find("does not end with ByteLevel"), std::string::npos);
  // A member of the wrong JSON type is a user error naming the file, not a JSON exception.
  const std::string typed = refusal(tokenizer_json({{"a", "zero"}}));
  EXPECT_NE(typed.find("fixture.json: vocabulary id of 'a' must be an integer"), std::string::npos) << typed;
}

}  // namespace
}  // namespace tandem
