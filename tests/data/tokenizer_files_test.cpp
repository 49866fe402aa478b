// Finding and opening a tokenizer (data/tokenizer_files.h): what a folder or a file resolves to,
// tokenizer_config.json's forms of names, flags and chat templates, the reader chosen by content,
// the fall-back to tokenizer.model, and the errors that name the fix.

#include "tandem/data/tokenizer_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../test_util.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using test::error_of;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The smallest byte-level BPE tokenizer.json tandem reads: "a", "b", "ab" and two special tokens.
json tiny_bpe_json() {
  json added = json::array();
  added.push_back({{"id", 3}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}});
  added.push_back({{"id", 4}, {"content", "<s>"}, {"special", true}, {"normalized", false}});
  return {{"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"<|endoftext|>", 3}, {"<s>", 4}}},
            {"merges", json::array({"a b"})}}}};
}

TokenizerConfig config_of(const test::TempDir& dir, const std::string& text) {
  write_text(dir.file("tokenizer_config.json"), text);
  return read_tokenizer_config(dir.file("tokenizer_config.json"));
}

TEST(TokenizerFiles, ByteNeedsNoFile) {
  const TokenizerSource s = find_tokenizer("byte");
  EXPECT_EQ(s.path, "byte");
  EXPECT_EQ(s.file, "");
  EXPECT_EQ(s.sibling, "");
  EXPECT_EQ(s.config_file, "");
  const auto t = open_tokenizer(s);
  EXPECT_EQ(t->kind(), TokenizerKind::kByte);
  EXPECT_EQ(t->vocab_size(), 256);
}

TEST(TokenizerFiles, AFolderPrefersTokenizerJsonAndKeepsTheModelBesideIt) {
  test::TempDir both, model_only;
  write_text(both.file("tokenizer.json"), tiny_bpe_json().dump());
  write_text(both.file("tokenizer.model"), "protobuf");
  const TokenizerSource s = find_tokenizer(both.path());
  EXPECT_EQ(s.path, both.path());
  EXPECT_EQ(s.file, both.file("tokenizer.json"));
  EXPECT_EQ(s.sibling, both.file("tokenizer.model"));
  EXPECT_EQ(s.config_file, "") << "no tokenizer_config.json here";
  write_text(model_only.file("tokenizer.model"), "protobuf");
  const TokenizerSource m = find_tokenizer(model_only.path());
  EXPECT_EQ(m.file, model_only.file("tokenizer.model"));
  EXPECT_EQ(m.sibling, "");
}

TEST(TokenizerFiles, AFileGivenDirectlyTakesTheSettingsOfItsFolder) {
  test::TempDir dir;
  write_text(dir.file("custom-name.json"), tiny_bpe_json().dump());
  write_text(dir.file("tokenizer_config.json"), R"({"eos_token": "<s>"})");
  write_text(dir.file("chat_template.jinja"), "{{ messages }}");
  const TokenizerSource s = find_tokenizer(dir.file("custom-name.json"));
  EXPECT_EQ(s.file, dir.file("custom-name.json"));
  EXPECT_EQ(s.sibling, "");
  EXPECT_EQ(s.config_file, dir.file("tokenizer_config.json"));
  EXPECT_EQ(s.config.eos_token, "<s>");
  EXPECT_EQ(s.config.chat_template, "{{ messages }}") << "chat_template.jinja when the config has none";
  EXPECT_EQ(open_tokenizer(s)->eos_id(), 4);
  write_text(dir.file("tokenizer_config.json"), R"({"chat_template": "{{ from_config }}"})");
  EXPECT_EQ(find_tokenizer(dir.file("custom-name.json")).config.chat_template, "{{ from_config }}")
      << "the config's own template wins over the .jinja file";
}

TEST(TokenizerFiles, TokenNamesAreStringsOrAddedTokenObjectsAndFlagsOnlyBooleans) {
  test::TempDir dir;
  const TokenizerConfig c =
      config_of(dir, R"({"bos_token": {"content": "<s>", "lstrip": false, "__type": "AddedToken"}, "eos_token": "</s>",
              "add_bos_token": false, "add_eos_token": "yes"})");
  EXPECT_EQ(c.bos_token, "<s>");
  EXPECT_EQ(c.eos_token, "</s>");
  EXPECT_EQ(c.add_bos_token, false);
  EXPECT_FALSE(c.add_eos_token.has_value()) << "a string is not a flag";
  EXPECT_EQ(c.chat_template, "");
  const TokenizerConfig unset = config_of(dir, R"({"bos_token": null, "eos_token": 2, "pad_token": "<pad>"})");
  EXPECT_FALSE(unset.bos_token.has_value());
  EXPECT_FALSE(unset.eos_token.has_value());
  EXPECT_FALSE(unset.add_bos_token.has_value());
  EXPECT_FALSE(config_of(dir, R"({"eos_token": {"id": 2}})").eos_token.has_value()) << "an object without content";
  const TokenizerConfig not_object = config_of(dir, R"(["<s>", "</s>"])");
  EXPECT_FALSE(not_object.bos_token.has_value() || not_object.eos_token.has_value());
}

TEST(TokenizerFiles, AChatTemplateListGivesItsDefaultEntry) {
  test::TempDir dir;
  EXPECT_EQ(config_of(dir, R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                                  {"name": "default", "template": "D"}]})")
                .chat_template,
            "D");
  EXPECT_EQ(config_of(dir, R"({"chat_template": [{"name": "rag", "template": "R"}]})").chat_template, "R")
      << "no default: the first";
  EXPECT_EQ(config_of(dir, R"({"chat_template": []})").chat_template, "");
  EXPECT_EQ(config_of(dir, R"({"chat_template": 7})").chat_template, "");
  EXPECT_EQ(config_of(dir, R"({"chat_template": ["not an entry", {"name": "default", "template": 3}]})").chat_template,
            "")
      << "entries that are not {name, template} texts give no template, never a crash";
}

TEST(TokenizerFiles, ABrokenConfigNamesItselfWhereverItIsRead) {
  test::TempDir dir;
  write_text(dir.file("tokenizer.json"), tiny_bpe_json().dump());
  write_text(dir.file("tokenizer_config.json"), "{\"eos_token\": ");
  const std::string path = dir.file("tokenizer_config.json");
  const std::string direct = error_of([&] { read_tokenizer_config(path); });
  EXPECT_NE(direct.find("'" + path + "' is not valid JSON ("), std::string::npos) << direct;
  EXPECT_NE(direct.find("fix or remove it"), std::string::npos) << direct;
  EXPECT_EQ(error_of([&] { find_tokenizer(dir.path()); }), direct);
  const std::string missing = error_of([&] { read_tokenizer_config(dir.file("none.json")); });
  EXPECT_NE(missing.find("cannot read tokenizer config '" + dir.file("none.json") + "'"), std::string::npos) << missing;
}

TEST(TokenizerFiles, AFolderWithoutATokenizerIsRefusedUnlessItIsAByteModel) {
  test::TempDir dir;
  const std::string empty = error_of([&] { find_tokenizer(dir.path()); });
  EXPECT_NE(empty.find("no tokenizer in '" + dir.path() + "': it holds neither tokenizer.json nor tokenizer.model"),
            std::string::npos)
      << empty;
  EXPECT_NE(empty.find("or 'byte' for tandem's byte models"), std::string::npos) << empty;
  write_text(dir.file("config.json"), R"({"vocab_size": 32000})");
  EXPECT_NE(error_of([&] { find_tokenizer(dir.path()); }).find("no tokenizer in"), std::string::npos);
  write_text(dir.file("config.json"), "{ not json");
  EXPECT_NE(error_of([&] { find_tokenizer(dir.path()); }).find("no tokenizer in"), std::string::npos)
      << "a broken config.json is no byte model, and no parse error either";
  write_text(dir.file("config.json"), R"({"vocab_size": 256, "model_type": "llama"})");
  const TokenizerSource s = find_tokenizer(dir.path());
  EXPECT_EQ(s.file, "");
  EXPECT_EQ(open_tokenizer(s)->kind(), TokenizerKind::kByte);
}

TEST(TokenizerFiles, AMissingPathNamesWhatToGive) {
  test::TempDir dir;
  const std::string missing = error_of([&] { find_tokenizer(dir.file("nowhere")); });
  EXPECT_NE(missing.find("tokenizer '" + dir.file("nowhere") +
                         "' does not exist; give --tokenizer a tokenizer.json, "
                         "a tokenizer.model, a model folder holding one, or 'byte'"),
            std::string::npos)
      << missing;
  EXPECT_NE(error_of([] { find_tokenizer(""); }).find("tokenizer '' does not exist"), std::string::npos);
}

TEST(TokenizerFiles, TheContentNotTheNameChoosesTheReader) {
  test::TempDir dir;
  write_text(dir.file("saved.model"), "\n  \t" + tiny_bpe_json().dump());  // JSON after white space
  const auto t = open_tokenizer(dir.file("saved.model"));
  EXPECT_EQ(t->kind(), TokenizerKind::kByteLevelBpe);
  EXPECT_EQ(t->encode("ab"), (std::vector<TokenId>{2}));
  for (const char* name : {"binary.json", "empty.json"}) {
    write_text(dir.file(name), std::string(name) == "empty.json" ? "  \n" : std::string("\x0a\x05<unk>", 7));
    const std::string msg = error_of([&] { open_tokenizer(dir.file(name)); });
    EXPECT_NE(msg.find("'" + dir.file(name) + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("SentencePiece"), std::string::npos) << "read as a SentencePiece model: " << msg;
  }
}

TEST(TokenizerFiles, AJsonTandemCannotReadFallsBackToTheModelBesideIt) {
  test::TempDir dir;
  json wordpiece = tiny_bpe_json();
  wordpiece["model"]["type"] = "WordPiece";
  write_text(dir.file("tokenizer.json"), wordpiece.dump());
  const std::string alone = error_of([&] { open_tokenizer(dir.path()); });
  EXPECT_NE(alone.find("model 'WordPiece' is not read"), std::string::npos) << alone;
  write_text(dir.file("tokenizer.model"), "not a protobuf");
  const std::string with_sibling = error_of([&] { open_tokenizer(dir.path()); });
  EXPECT_NE(with_sibling.find("'" + dir.file("tokenizer.model") + "'"), std::string::npos)
      << "the sibling was read instead: " << with_sibling;
  EXPECT_EQ(with_sibling.find("WordPiece"), std::string::npos) << with_sibling;
}

TEST(TokenizerFiles, OverridesReplaceOnlyTheNamesTheyGive) {
  test::TempDir dir;
  write_text(dir.file("tokenizer.json"), tiny_bpe_json().dump());
  write_text(dir.file("tokenizer_config.json"), R"({"bos_token": "<|endoftext|>", "eos_token": "<s>"})");
  const TokenizerSource s = find_tokenizer(dir.path());
  const auto from_config = open_tokenizer(s);
  EXPECT_EQ(from_config->bos_id(), 3);
  EXPECT_EQ(from_config->eos_id(), 4);
  SpecialTokenNames bos_only;
  bos_only.bos = "<s>";
  const auto bos_over = open_tokenizer(s, bos_only);
  EXPECT_EQ(bos_over->bos_id(), 4);
  EXPECT_EQ(bos_over->eos_id(), 4) << "the config's EOS stays";
  SpecialTokenNames eos_only;
  eos_only.eos = "<|endoftext|>";
  const auto eos_over = open_tokenizer(s, eos_only);
  EXPECT_EQ(eos_over->bos_id(), 3);
  EXPECT_EQ(eos_over->eos_id(), 3);
  // Without a config the tokenizer's own choice: the usual names.
  std::filesystem::remove(dir.file("tokenizer_config.json"));
  const auto own = open_tokenizer(dir.path());
  EXPECT_EQ(own->bos_id(), 4);
  EXPECT_EQ(own->eos_id(), 3);
}

}  // namespace
}  // namespace tandem
