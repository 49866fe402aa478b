// SentencePiece-style BPE from hand-written tokenizer.json files (Note [SentencePiece-style BPE]):
// byte fallback, the Llama normalizers and Metaspace's prepend schemes, merges by rank, the
// Replace/ByteFallback/Fuse/Strip decoder and streaming bytes, and the errors for what tandem does
// not read. tests/python/test_tokenizers_parity.py holds the same reader to `tokenizers`.

#include "tandem/data/sp_bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../error_of.h"
#include "tandem/core/strings.h"
#include "tandem/data/tokenizer_files.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using test::error_of;
using Ids = std::vector<TokenId>;

const std::string kSp = "\xE2\x96\x81";  // '▁' (U+2581)

// The id of byte b's token "<0xXX>" in the fixture: 3 + b.
TokenId byte_id(int b) { return 3 + b; }

// Llama 2's layout, as LlamaConverter(legacy=True) writes it: <unk> <s> </s>, the 256 byte tokens,
// then characters and merges (ranked: "a b" before "a a" before "▁ a").
json llama_style_json() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[strprintf("<0x%02X>", b)] = byte_id(b);
  const std::vector<std::string> pieces = {kSp, "a", "b", "c", "ab", "aa", kSp + "a", kSp + "ab", "\n"};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = static_cast<int>(259 + i);
  json merges = json::array({"a b", json::array({"a", "a"}), kSp + " a", kSp + "a b"});
  json added = json::array();
  for (const char* t : {"<unk>", "<s>", "</s>"})
    added.push_back({{"id", vocab[t]}, {"content", t}, {"special", true}, {"normalized", false}});
  const json replace_space = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSp}};
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kSp}}, replace_space})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", kSp}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", merges}}}};
}

// The non-legacy layout: no normalizer, Metaspace with `scheme`.
json metaspace_json(const std::string& scheme) {
  json j = llama_style_json();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", scheme}, {"split", false}};
  return j;
}

std::unique_ptr<SpBpeTokenizer> sp(const json& j) { return SpBpeTokenizer::from_json(j.dump(), "fixture.json"); }

TokenId id_of(const SpBpeTokenizer& t, const std::string& token) { return t.token_to_id(token).value(); }

TEST(SpBpeTokenizer, MergesByRankLeftmostFirst) {
  const auto t = sp(llama_style_json());
  const TokenId space = id_of(*t, kSp), a = id_of(*t, "a"), ab = id_of(*t, "ab"), aa = id_of(*t, "aa"),
                sp_a = id_of(*t, kSp + "a");
  EXPECT_EQ(t->kind(), TokenizerKind::kSentencePieceBpe);
  EXPECT_EQ(t->encode("ab"), (Ids{space, ab}));      // (a,b) outranks (▁,a), so "▁ab" is never reached
  EXPECT_EQ(t->encode("aab"), (Ids{sp_a, ab}));      // (a,b) first, then (▁,a)
  EXPECT_EQ(t->encode("aaa"), (Ids{space, aa, a}));  // the leftmost (a,a) first; (▁,a) is then stale
  EXPECT_EQ(t->encode("ac"), (Ids{sp_a, id_of(*t, "c")}));
  EXPECT_EQ(t->encode(""), Ids{});
  EXPECT_EQ(t->vocab_size(), 259 + 9);
  EXPECT_EQ(t->id_to_token(sp_a), kSp + "a");
}

TEST(SpBpeTokenizer, ByteFallbackSpellsUnknownCharactersAsBytes) {
  const auto t = sp(llama_style_json());
  const TokenId space = id_of(*t, kSp), sp_a = id_of(*t, kSp + "a");
  EXPECT_EQ(t->encode("\xC3\xA9"), (Ids{space, byte_id(0xC3), byte_id(0xA9)}));  // 'é' is not in the vocabulary
  EXPECT_EQ(t->encode("a\xFF"), (Ids{sp_a, byte_id(0xFF)}));                     // malformed input: its byte
  EXPECT_EQ(t->decode(t->encode("\xC3\xA9 a\n")), "\xC3\xA9 a\n");
  // A run of byte tokens that is not UTF-8 decodes as one U+FFFD per token, as ByteFallback does.
  EXPECT_EQ(t->decode({byte_id(0xE6), byte_id(0x97), sp_a}), "\xEF\xBF\xBD\xEF\xBF\xBD a");
  json no_fallback = llama_style_json();
  no_fallback["model"]["byte_fallback"] = false;
  EXPECT_EQ(sp(no_fallback)
                ->encode("\xC3\xA9\xC3\xA9"
                         "a"),
            (Ids{space, 0, id_of(*t, "a")}));  // one fused <unk>
  no_fallback["model"]["fuse_unk"] = false;
  EXPECT_EQ(sp(no_fallback)->encode("\xC3\xA9\xC3\xA9"), (Ids{space, 0, 0}));
  no_fallback["model"]["unk_token"] = nullptr;
  EXPECT_EQ(sp(no_fallback)
                ->encode("\xC3\xA9"
                         "a"),
            (Ids{sp_a}));  // no unk_token: dropped
}

TEST(SpBpeTokenizer, PrependReplaceNormalizerPrefixesEveryPiece) {
  const auto t = sp(llama_style_json());
  const TokenId space = id_of(*t, kSp), ab = id_of(*t, "ab"), sp_a = id_of(*t, kSp + "a");
  EXPECT_EQ(t->encode(" ab"), (Ids{space, space, ab}));  // Prepend does not look: two ▁
  EXPECT_EQ(t->encode("<s>ab"), (Ids{1, space, ab}));    // each piece between added tokens
  EXPECT_EQ(t->encode("aa ab", SpecialTokens::kInclude), (Ids{1, space, id_of(*t, "aa"), space, ab}));
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  json gemma = llama_style_json();  // Gemma: Replace alone, no dummy prefix
  gemma["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSp}};
  EXPECT_EQ(sp(gemma)->encode("ab a"), (Ids{ab, sp_a}));
}

TEST(SpBpeTokenizer, MetaspacePrependSchemes) {
  const auto first = sp(metaspace_json("first")), always = sp(metaspace_json("always")),
             never = sp(metaspace_json("never"));
  const TokenId space = id_of(*first, kSp), ab = id_of(*first, "ab"), sp_a = id_of(*first, kSp + "a");
  EXPECT_EQ(first->encode("ab"), (Ids{space, ab}));
  EXPECT_EQ(first->encode(" ab"), (Ids{space, ab}));        // already starts with ▁: none added
  EXPECT_EQ(first->encode("<s>ab a"), (Ids{1, ab, sp_a}));  // not the text's first piece
  EXPECT_EQ(always->encode("<s>ab a"), (Ids{1, space, ab, sp_a}));
  EXPECT_EQ(never->encode("ab a"), (Ids{ab, sp_a}));
  json split = metaspace_json("always");
  split["pre_tokenizer"]["split"] = true;  // words cut before each ▁
  EXPECT_EQ(sp(split)->encode("a  a"), (Ids{sp_a, space, sp_a}));
  json older = metaspace_json("first");  // files before prepend_scheme: add_prefix_space
  older["pre_tokenizer"].erase("prepend_scheme");
  older["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(sp(older)->encode("ab"), (Ids{ab}));
}

TEST(SpBpeTokenizer, DecodeRunsTheDecoderChainAndStreamsItsBytes) {
  const auto t = sp(metaspace_json("first"));
  const TokenId space = id_of(*t, kSp), ab = id_of(*t, "ab"), sp_a = id_of(*t, kSp + "a");
  EXPECT_EQ(t->decode({space, ab, sp_a}), "ab a");  // Strip drops the text's first space only
  EXPECT_EQ(t->decode({1, space, ab}), "<s> ab");   // the special token is text: nothing to strip
  EXPECT_EQ(t->decode({1, space, ab}, SpecialTokens::kOmit), "ab");
  EXPECT_EQ(t->token_bytes(sp_a), " a");
  EXPECT_EQ(t->token_bytes(sp_a, TokenPlace::kFirst), "a");
  EXPECT_EQ(t->token_bytes(byte_id('\n')), "\n");
  EXPECT_EQ(t->token_bytes(byte_id(0xC3)), "\xC3");  // half a character: the stream holds it back
  const std::string text = "aab \xC3\xA9\nab c";
  const Ids ids = t->encode(text, SpecialTokens::kInclude);
  std::string streamed;
  bool first = true;
  for (TokenId id : ids) {
    if (id == 1) continue;  // a control token shows as nothing
    streamed += t->token_bytes(id, first ? TokenPlace::kFirst : TokenPlace::kFollowing);
    first = false;
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(t->decode(ids, SpecialTokens::kOmit), text);
  ASSERT_EQ(t->special_tokens().size(), 3u);
  EXPECT_EQ(t->special_tokens()[1].text, "<s>");
}

TEST(SpBpeTokenizer, BadFilesNameTheProblem) {
  auto error = [](const std::function<void(json&)>& damage) {
    json j = llama_style_json();
    damage(j);
    return error_of([&] { sp(j); });
  };
  EXPECT_NE(error([](json& j) {
              j["pre_tokenizer"] = {{"type", "Whitespace"}};
            }).find("pre-tokenizer 'Whitespace' is not read"),
            std::string::npos);
  EXPECT_NE(error([](json& j) {
              j["decoder"] = {{"type", "WordPiece"}};
            }).find("decoder 'WordPiece' is not read"),
            std::string::npos);
  EXPECT_NE(
      error([](json& j) { j["model"]["unk_token"] = "<nope>"; }).find("unk_token '<nope>' is not in the vocabulary"),
      std::string::npos);
  EXPECT_NE(error([](json& j) {
              j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
            }).find("'Precompiled'"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j["model"]["merges"].push_back("a zz"); }).find("names a token the vocabulary lacks"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j = metaspace_json("sometimes"); }).find("prepend_scheme 'sometimes' is unknown"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j["model"]["dropout"] = 0.1; }).find("set \"dropout\" to null"), std::string::npos);
  EXPECT_NE(error([](json& j) {
              j["model"] = {{"type", "BPE"}, {"vocab", json::object()}, {"merges", json::array()}};
              j["added_tokens"] = j["post_processor"] = nullptr;
            }).find("empty vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([] { SpBpeTokenizer::from_json("{", "broken.json"); }).find("broken.json is not valid JSON"),
            std::string::npos);
}

TEST(TokenizerFiles, OpensSentencePieceStyleJsonItself) {
  const std::string dir = ::testing::TempDir() + "/sp_bpe_folder";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << metaspace_json("first").dump();
  std::ofstream(dir + "/tokenizer.model") << "not read: the JSON is";
  const auto t = open_tokenizer(dir);
  EXPECT_EQ(t->kind(), TokenizerKind::kSentencePieceBpe);
  EXPECT_EQ(t->encode("ab", SpecialTokens::kInclude),
            (Ids{1, t->token_to_id(kSp).value(), t->token_to_id("ab").value()}));
  EXPECT_NE(t->description().find("SentencePiece-style BPE"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem
