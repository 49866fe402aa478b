// The tokenizer.json parts both BPE readers share (data/tokenizer_json.h): checked member access,
// which reader a file is for, the post-processor's template, the choice of BOS and EOS, the
// vocabulary's id range and the one-line description.

#include "tandem/data/tokenizer_json.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error_of.h"

namespace tandem {
namespace {

using detail::json;
using detail::TokenTemplate;
using test::error_of;
using Ids = std::vector<TokenId>;

// A vocabulary lookup over a fixed table.
detail::FindToken finder(std::map<std::string, TokenId> table) {
  return [table = std::move(table)](std::string_view t) -> std::optional<TokenId> {
    const auto it = table.find(std::string(t));
    return it == table.end() ? std::nullopt : std::optional<TokenId>(it->second);
  };
}

const detail::FindToken kNothing = finder({});

json bpe_model(json extra = json::object()) {
  json m = {{"type", "BPE"}, {"vocab", json::object()}, {"merges", json::array()}};
  m.update(extra);
  return m;
}

TEST(TokenizerJson, ParseNamesTheSourceOfBrokenJson) {
  EXPECT_EQ(detail::parse_tokenizer_json(R"({"model": {"type": "BPE"}})", "t.json")["model"]["type"], "BPE");
  const std::string msg = error_of([] { detail::parse_tokenizer_json("{\"model\": ", "dir/tokenizer.json"); });
  EXPECT_NE(msg.find("dir/tokenizer.json is not valid JSON ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("re-download or re-save the tokenizer"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { detail::parse_tokenizer_json("", "empty.json"); }).find("empty.json is not valid JSON"),
            std::string::npos);
}

TEST(TokenizerJson, MemberReturnsTheValueOrNamesWhereItIsMissing) {
  const json j = {{"model", {{"type", "BPE"}}}, {"nothing", nullptr}};
  EXPECT_EQ(&detail::member(j, "model", "t.json"), &j.at("model")) << "a reference into j, not a copy";
  EXPECT_TRUE(detail::member(j, "nothing", "t.json").is_null()) << "present, even if null";
  const std::string missing = error_of([&] { detail::member(j, "vocab", "t.json's model"); });
  EXPECT_NE(missing.find("t.json's model has no \"vocab\"; is this a Hugging Face tokenizer.json"), std::string::npos)
      << missing;
  const std::string not_object = error_of([] { detail::member(json::array({1, 2}), "type", "list"); });
  EXPECT_NE(not_object.find("list has no \"type\""), std::string::npos) << not_object;
  EXPECT_NE(error_of([] { detail::member(json("text"), "type", "a string"); }).find("a string has no"),
            std::string::npos);
}

TEST(TokenizerJson, TypeOfIsEmptyUnlessTypeIsAString) {
  EXPECT_EQ(detail::type_of({{"type", "Metaspace"}}), "Metaspace");
  EXPECT_EQ(detail::type_of(json()), "");
  EXPECT_EQ(detail::type_of(json::array({"type"})), "");
  EXPECT_EQ(detail::type_of({{"kind", "BPE"}}), "");
  EXPECT_EQ(detail::type_of({{"type", 3}}), "");
}

TEST(TokenizerJson, ByteFallbackOrMetaspaceWithoutByteLevelMeansSentencePieceStyle) {
  const auto file = [](json model, json pre) {
    json t = {{"model", std::move(model)}};
    if (!pre.is_null()) t["pre_tokenizer"] = std::move(pre);
    return t;
  };
  const json metaspace = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}};
  const json byte_level = {{"type", "ByteLevel"}};
  EXPECT_TRUE(detail::is_sentencepiece_style_bpe(file(bpe_model({{"byte_fallback", true}}), json())));
  EXPECT_TRUE(detail::is_sentencepiece_style_bpe(file(bpe_model({{"byte_fallback", true}}), byte_level)))
      << "byte_fallback alone decides";
  EXPECT_FALSE(detail::is_sentencepiece_style_bpe(file(bpe_model({{"byte_fallback", false}}), byte_level)));
  EXPECT_FALSE(detail::is_sentencepiece_style_bpe(file(bpe_model(), json())));
  EXPECT_TRUE(detail::is_sentencepiece_style_bpe(file(bpe_model(), metaspace)));
  EXPECT_TRUE(detail::is_sentencepiece_style_bpe(
      file(bpe_model({{"byte_fallback", false}}),
           {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "Split"}}, metaspace})}})))
      << "Metaspace inside a Sequence";
  EXPECT_FALSE(detail::is_sentencepiece_style_bpe(
      file(bpe_model(), {{"type", "Sequence"}, {"pretokenizers", json::array({metaspace, byte_level})}})))
      << "Metaspace beside ByteLevel is byte-level";
  EXPECT_FALSE(detail::is_sentencepiece_style_bpe(file(bpe_model({{"byte_fallback", "true"}}), json())))
      << "only a JSON true counts";
  EXPECT_FALSE(detail::is_sentencepiece_style_bpe(file({{"type", "Unigram"}, {"byte_fallback", true}}, metaspace)))
      << "not BPE at all";
  EXPECT_FALSE(detail::is_sentencepiece_style_bpe(json::object()));
  EXPECT_FALSE(detail::is_sentencepiece_style_bpe(json::array()));
}

TEST(TokenizerJson, TemplateProcessingPutsSpecialTokensBeforeAndAfterTheText) {
  const json p = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<sys>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}, {"</s>", {{"id", "</s>"}, {"ids", {2, 3}}}}}}};
  // "<sys>" is not among special_tokens: its id comes from the vocabulary.
  const TokenTemplate t = detail::parse_post_processor(p, "t.json", finder({{"<sys>", 40}, {"<s>", 99}}));
  EXPECT_EQ(t.before, (Ids{1, 40})) << "special_tokens' ids win over the vocabulary's";
  EXPECT_EQ(t.after, (Ids{2, 3}));
  json undefined = p;
  undefined["single"][1]["SpecialToken"]["id"] = "<nope>";
  const std::string msg = error_of([&] { detail::parse_post_processor(undefined, "t.json", kNothing); });
  EXPECT_NE(msg.find("t.json: the post_processor's template names '<nope>', which it does not define"),
            std::string::npos)
      << msg;
  json no_single = p;
  no_single.erase("single");
  EXPECT_NE(error_of([&] {
              detail::parse_post_processor(no_single, "t.json", kNothing);
            }).find("t.json's TemplateProcessing has no \"single\""),
            std::string::npos);
}

TEST(TokenizerJson, NoneByteLevelRobertaBertAndSequencesOfThem) {
  const TokenTemplate none = detail::parse_post_processor(json(), "t.json", kNothing);
  EXPECT_TRUE(none.before.empty() && none.after.empty());
  const TokenTemplate byte_level = detail::parse_post_processor({{"type", "ByteLevel"}}, "t.json", kNothing);
  EXPECT_TRUE(byte_level.before.empty() && byte_level.after.empty());
  const json roberta = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 0}}, {"sep", {"</s>", 2}}};
  const TokenTemplate r = detail::parse_post_processor(roberta, "t.json", kNothing);
  EXPECT_EQ(r.before, (Ids{0}));
  EXPECT_EQ(r.after, (Ids{2}));
  const json bert = {{"type", "BertProcessing"}, {"cls", {"[CLS]", 101}}, {"sep", {"[SEP]", 102}}};
  const TokenTemplate b = detail::parse_post_processor(bert, "t.json", kNothing);
  EXPECT_EQ(b.before, (Ids{101}));
  EXPECT_EQ(b.after, (Ids{102}));
  const json sequence = {{"type", "Sequence"}, {"processors", json::array({{{"type", "ByteLevel"}}, roberta})}};
  const TokenTemplate s = detail::parse_post_processor(sequence, "t.json", kNothing);
  EXPECT_EQ(s.before, (Ids{0}));
  EXPECT_EQ(s.after, (Ids{2}));
  const std::string short_cls = error_of([] {
    detail::parse_post_processor({{"type", "BertProcessing"}, {"cls", {"[CLS]"}}, {"sep", {"[SEP]", 102}}}, "t.json",
                                 finder({}));
  });
  EXPECT_NE(short_cls.find("t.json: the BertProcessing's cls must be [token, id]"), std::string::npos) << short_cls;
  const std::string negative = error_of([] {
    detail::parse_post_processor({{"type", "RobertaProcessing"}, {"cls", {"<s>", 0}}, {"sep", {"</s>", -2}}}, "t.json",
                                 finder({}));
  });
  EXPECT_NE(negative.find("token id -2 is out of range"), std::string::npos) << negative;
  const std::string unknown = error_of([] {
    detail::parse_post_processor({{"type", "CustomProcessing"}}, "t.json", finder({}));
  });
  EXPECT_NE(unknown.find("t.json: post_processor 'CustomProcessing' is not read by tandem"), std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find("TemplateProcessing"), std::string::npos) << unknown;
  EXPECT_NE(error_of([] {
              detail::parse_post_processor({{"type", "Sequence"}}, "t.json", finder({}));
            }).find("has no \"processors\""),
            std::string::npos);
}

TEST(TokenizerJson, NamedBosAndEosWinAndAMissingNameIsAUserError) {
  const auto find = finder({{"<s>", 1}, {"</s>", 2}, {"<|eot|>", 7}});
  const TokenTemplate tmpl{{1}, {}};
  SpecialTokenNames names;
  names.bos = "</s>";
  names.eos = "<|eot|>";
  const auto [bos, eos] = detail::choose_bos_eos(names, tmpl, "t.json", find);
  EXPECT_EQ(bos, 2) << "the name wins over the template's first token";
  EXPECT_EQ(eos, 7) << "the name wins over the usual names";
  names.eos = "<|eos|>";
  const std::string msg = error_of([&] { detail::choose_bos_eos(names, tmpl, "t.json", find); });
  EXPECT_NE(msg.find("t.json has no token '<|eos|>', which the EOS setting names; fix the name"), std::string::npos)
      << msg;
  SpecialTokenNames bad_bos;
  bad_bos.bos = "<bos>";
  EXPECT_NE(
      error_of([&] { detail::choose_bos_eos(bad_bos, tmpl, "t.json", find); }).find("which the BOS setting names"),
      std::string::npos);
}

TEST(TokenizerJson, UnnamedBosComesFromTheTemplateThenTheUsualNamesInOrder) {
  const TokenTemplate empty;
  const auto bos_of = [&](std::map<std::string, TokenId> table, const TokenTemplate& tmpl) {
    return detail::choose_bos_eos({}, tmpl, "t.json", finder(std::move(table))).first;
  };
  EXPECT_EQ(bos_of({{"<s>", 1}}, TokenTemplate{{5, 6}, {9}}), 5) << "the template's first token";
  EXPECT_EQ(bos_of({{"<s>", 1}, {"<bos>", 2}, {"<|begin_of_text|>", 3}}, empty), 3);
  EXPECT_EQ(bos_of({{"<s>", 1}, {"<bos>", 2}}, empty), 1);
  EXPECT_EQ(bos_of({{"<bos>", 2}}, empty), 2);
  EXPECT_FALSE(bos_of({{"[CLS]", 2}}, empty).has_value());
}

TEST(TokenizerJson, UnnamedEosIsTheFirstOfTheUsualNamesNeverTheTemplatesLast) {
  const auto eos_of = [](std::map<std::string, TokenId> table) {
    return detail::choose_bos_eos({}, TokenTemplate{{}, {42}}, "t.json", finder(std::move(table))).second;
  };
  EXPECT_EQ(eos_of({{"</s>", 2}, {"<|endoftext|>", 5}}), 5);
  EXPECT_EQ(eos_of({{"</s>", 2}, {"<|end_of_text|>", 6}}), 6);
  EXPECT_EQ(eos_of({{"<|im_end|>", 9}, {"</s>", 2}}), 2);
  EXPECT_EQ(eos_of({{"<|im_end|>", 9}, {"<eos>", 3}}), 3);
  EXPECT_EQ(eos_of({{"<|im_end|>", 9}}), 9);
  EXPECT_FALSE(eos_of({{"[SEP]", 42}}).has_value());
}

TEST(TokenizerJson, VocabularyIdsMustFitIn31Bits) {
  const auto vocab = detail::parse_vocab({{"vocab", {{"a", 0}, {"b", 1}, {"top", 2147483647LL}}}}, "t.json");
  std::map<std::string, TokenId> got(vocab.begin(), vocab.end());
  EXPECT_EQ(got, (std::map<std::string, TokenId>{{"a", 0}, {"b", 1}, {"top", 2147483647}}));
  const std::string negative = error_of([] { detail::parse_vocab({{"vocab", {{"x", -1}}}}, "t.json"); });
  EXPECT_NE(negative.find("t.json: vocabulary id -1 of 'x' is out of range"), std::string::npos) << negative;
  const std::string big = error_of([] { detail::parse_vocab({{"vocab", {{"y", 2147483648LL}}}}, "t.json"); });
  EXPECT_NE(big.find("vocabulary id 2147483648 of 'y' is out of range"), std::string::npos) << big;
  EXPECT_NE(error_of([] {
              detail::parse_vocab({{"type", "BPE"}}, "t.json");
            }).find("t.json's model has no \"vocab\""),
            std::string::npos);
  EXPECT_TRUE(detail::parse_vocab({{"vocab", json::object()}}, "t.json").empty());
}

TEST(TokenizerJson, DescriptionNamesKindSourceSizesBosAndEos) {
  const std::vector<std::string> stored = {"<s>", "a", "</s>"};
  EXPECT_EQ(detail::describe_json_tokenizer("byte-level BPE", "m/tokenizer.json", stored, 2, 0, 2),
            "byte-level BPE from m/tokenizer.json: 3 tokens (2 added), BOS '<s>' (0), EOS '</s>' (2)");
  EXPECT_EQ(detail::describe_json_tokenizer("SentencePiece-style BPE", "t.json", stored, 0, std::nullopt, std::nullopt),
            "SentencePiece-style BPE from t.json: 3 tokens (0 added), BOS none, EOS none");
}

}  // namespace
}  // namespace tandem
