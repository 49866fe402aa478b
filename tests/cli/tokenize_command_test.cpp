// `tandem tokenize` in-process (cli/tokenize_command.h): its options reach the corpus tokenizer
// (--field, --val-fraction, --threads, --eos), the summary line names what was written and how the
// held-out split was chosen, progress goes to stderr, and bad input is refused.

#include "tandem/cli/tokenize_command.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"
#include "command_run.h"
#include "tandem/core/strings.h"
#include "tandem/data/token_file.h"

namespace tandem {
namespace {

using test::error_of;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

using Tokenized = test::CommandRun;

Tokenized tokenize(const std::vector<std::string>& argv) { return test::run_command<TokenizeCommand>(argv); }

std::vector<int64_t> tokens_of(const std::string& path) {
  const TokenBuffer b = TokenBuffer::open(path);
  std::vector<int64_t> out(static_cast<size_t>(b.size()));
  b.read(0, b.size(), out.data());
  return out;
}

std::vector<int64_t> bytes_of(const std::string& text) {
  std::vector<int64_t> out;
  for (char c : text) out.push_back(static_cast<unsigned char>(c));
  return out;
}

// The 94 printable ASCII bytes, the space and the line break (ids 0..95), <|endoftext|> (96) and
// <|sep|> (97).
std::string ascii_tokenizer_json() { return test::ascii_tokenizer_json({"<|endoftext|>", "<|sep|>"}); }

TEST(TokenizeCommand, WritesTheDocumentsAndSaysWhereAndHowTheyWereSplit) {
  test::TempDir dir;
  write_text(dir.file("a.jsonl"),
             "{\"body\": \"one\"}\n{\"body\": \"two\"}\n{\"body\": \"three\"}\n{\"body\": \"four\"}\n");
  write_text(dir.file("tokenizer.json"), ascii_tokenizer_json());
  const std::string out = dir.file("data/train.bin");
  const Tokenized r = tokenize({"tokenize", "--tokenizer", dir.file("tokenizer.json"), "--out", out, "--field", "body",
                                "--val-fraction", "0.5", "--threads", "1", dir.file("a.jsonl")});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  // Every second document held out, each ended by the tokenizer's EOS (96).
  const auto ids = [](const std::string& word) {
    std::vector<int64_t> v;
    for (char c : word) v.push_back(c - '!');
    v.push_back(96);
    return v;
  };
  std::vector<int64_t> train = ids("one"), val = ids("two");
  for (auto t : ids("three")) train.push_back(t);
  for (auto t : ids("four")) val.push_back(t);
  EXPECT_EQ(tokens_of(out), train);
  EXPECT_EQ(tokens_of(dir.file("data/train_val.bin")), val);
  for (const std::string& want : {std::string("tokenized 4 documents from 1 file "), std::string("on 1 thread,"),
                                  std::string("EOS '<|endoftext|>' (96): ") + out + " (" +
                                      format_count(double(train.size())) + " tokens, 2 documents, uint16)",
                                  ", " + dir.file("data/train_val.bin") + " (" + format_count(double(val.size())) +
                                      " tokens, 2 documents: one in 2)"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  // Progress on stderr (not a terminal here): a line, the last at 100 %.
  EXPECT_NE(r.err.find("[" + std::string(30, '#') + "] 100%"), std::string::npos) << r.err;
}

TEST(TokenizeCommand, EosNamesTheSeparatorAndTheByteTokenizerHasNone) {
  test::TempDir dir;
  write_text(dir.file("tokenizer.json"), ascii_tokenizer_json());
  write_text(dir.file("doc.txt"), "a b");
  const Tokenized sep = tokenize({"tokenize", "--tokenizer", dir.file("tokenizer.json"), "--out", dir.file("sep.bin"),
                                  "--eos", "<|sep|>", "--val-fraction", "0", dir.file("doc.txt")});
  ASSERT_EQ(sep.error, "");
  EXPECT_EQ(tokens_of(dir.file("sep.bin")), (std::vector<int64_t>{'a' - '!', 94, 'b' - '!', 97}));
  EXPECT_NE(sep.out.find("EOS '<|sep|>' (97)"), std::string::npos) << sep.out;
  EXPECT_NE(tokenize({"tokenize", "--tokenizer", dir.file("tokenizer.json"), "--out", dir.file("x.bin"), "--eos",
                      "<|nope|>", dir.file("doc.txt")})
                .error.find("<|nope|>"),
            std::string::npos);
  // The byte tokenizer: no separator (and a warning that says so), the bytes as they are.
  const Tokenized bytes = tokenize(
      {"tokenize", "--tokenizer", "byte", "--out", dir.file("b.bin"), "--val-fraction", "0", dir.file("doc.txt")});
  ASSERT_EQ(bytes.error, "");
  EXPECT_EQ(tokens_of(dir.file("b.bin")), bytes_of("a b"));
  EXPECT_NE(bytes.out.find("EOS none: "), std::string::npos) << bytes.out;
  EXPECT_NE(bytes.err.find("the byte tokenizer has no EOS token"), std::string::npos) << bytes.err;
  EXPECT_EQ(bytes.err.find("--eos"), std::string::npos) << "no advice it cannot take: " << bytes.err;
  const Tokenized byte_eos = tokenize({"tokenize", "--tokenizer", "byte", "--out", dir.file("e.bin"), "--eos", "\n",
                                       "--val-fraction", "0", dir.file("doc.txt")});
  EXPECT_NE(byte_eos.error.find("the byte tokenizer has no special tokens"), std::string::npos) << byte_eos.error;
  EXPECT_FALSE(std::filesystem::exists(dir.file("e.bin")));
  // --val-fraction 0 says nothing of a held-out file; a single token cannot be split, which is said.
  EXPECT_EQ(bytes.out.find("_val.bin"), std::string::npos) << bytes.out;
  EXPECT_EQ(bytes.out.find("too few tokens"), std::string::npos) << bytes.out;
  write_text(dir.file("one.txt"), "x");
  const Tokenized tiny = tokenize(
      {"tokenize", "--tokenizer", "byte", "--out", dir.file("t.bin"), "--val-fraction", "0.01", dir.file("one.txt")});
  ASSERT_EQ(tiny.error, "");
  EXPECT_NE(tiny.out.find(" (too few tokens to hold any out)"), std::string::npos) << tiny.out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("t_val.bin")));
}

// Fewer documents than 1/val-fraction: the tail of the tokens is held out instead.
TEST(TokenizeCommand, FewDocumentsHoldOutTheTailOfTheTokens) {
  test::TempDir dir;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "a line of plain text.\n";
  write_text(dir.file("one.txt"), text);
  const Tokenized r = tokenize(
      {"tokenize", "--tokenizer", "byte", "--out", dir.file("t.bin"), "--val-fraction", "0.1", dir.file("one.txt")});
  ASSERT_EQ(r.error, "");
  const auto train = tokens_of(dir.file("t.bin")), val = tokens_of(dir.file("t_val.bin"));
  EXPECT_EQ(train.size() + val.size(), text.size());
  EXPECT_NE(r.out.find(", " + dir.file("t_val.bin") + " (" + format_count(double(val.size())) +
                       " tokens: the last 10% of the tokens, as there are fewer than 10 documents)"),
            std::string::npos)
      << r.out;
}

TEST(TokenizeCommand, ATailShareBelowOneTokenIsCalledTheLastToken) {
  test::TempDir dir;
  write_text(dir.file("one.txt"), std::string(150, 'a'));  // 150 tokens, 0.1 % of them is 0.15
  const Tokenized r = tokenize(
      {"tokenize", "--tokenizer", "byte", "--out", dir.file("t.bin"), "--val-fraction", "0.001", dir.file("one.txt")});
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(tokens_of(dir.file("t_val.bin")).size(), 1u) << r.out;
  EXPECT_NE(r.out.find("(1 token: the last token, as --val-fraction's share is less than one, as there are fewer "
                       "than 1000 documents)"),
            std::string::npos)
      << r.out;
}

TEST(TokenizeCommand, MissingOrBadInputIsRefused) {
  test::TempDir dir;
  write_text(dir.file("doc.txt"), "text");
  const auto parse_error = [](const std::vector<std::string>& argv) {
    CLI::App app{"tokenize test"};
    TokenizeCommand command(app);
    std::vector<std::string> reversed(argv.rbegin(), argv.rend());
    app.parse(reversed);
  };
  EXPECT_THROW(parse_error({"tokenize", "--out", "x.bin", "doc.txt"}), CLI::RequiredError);       // no --tokenizer
  EXPECT_THROW(parse_error({"tokenize", "--tokenizer", "byte", "doc.txt"}), CLI::RequiredError);  // no --out
  EXPECT_THROW(parse_error({"tokenize", "--tokenizer", "byte", "--out", "x.bin"}), CLI::RequiredError);  // no input
  EXPECT_THROW(parse_error({"tokenize", "--tokenizer", "byte", "--out", "x.bin", "--threads", "-1", "doc.txt"}),
               CLI::ValidationError);
  const std::string fraction = tokenize({"tokenize", "--tokenizer", "byte", "--out", dir.file("o.bin"),
                                         "--val-fraction", "1", dir.file("doc.txt")})
                                   .error;
  EXPECT_NE(fraction.find("--val-fraction 1 is not in [0, 1)"), std::string::npos) << fraction;
  EXPECT_NE(
      tokenize({"tokenize", "--tokenizer", dir.file("none.json"), "--out", dir.file("o.bin"), dir.file("doc.txt")})
          .error.find("tokenizer '" + dir.file("none.json") + "' does not exist"),
      std::string::npos);
  EXPECT_NE(tokenize({"tokenize", "--tokenizer", "byte", "--out", dir.file("o.bin"), dir.file("gone.txt")})
                .error.find("input '" + dir.file("gone.txt") + "' does not exist"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.file("o.bin")));
}

}  // namespace
}  // namespace tandem
