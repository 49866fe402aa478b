// `tandem generate` as a user meets it: a checkpoint that `tandem train` wrote, greedy output that
// repeats exactly, a seed that repeats a sampled output, a batch of prompts, and bad input as one
// line with exit code 2.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "../test_util.h"
#include "cli_run.h"

namespace tandem {
namespace {

using Result = test::CliResult;
using test::run_cli;

class GenerateCli : public ::testing::Test {
 protected:
  // One tiny byte-level model trained for a few steps, shared by the tests.
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    const Result r = run_cli("train --steps 3 --run-dir " + dir_->file("run") +
                             " --set train.seq_len=16 --set data.synthetic_bytes=20000 --device cpu");
    train_error_ = r.code == 0 ? "" : r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_EQ(train_error_, ""); }

  static std::string run() { return dir_->file("run"); }

  static test::TempDir* dir_;
  static std::string train_error_;
};
test::TempDir* GenerateCli::dir_ = nullptr;
std::string GenerateCli::train_error_;

TEST_F(GenerateCli, GreedyOutputRepeatsAndTheStatisticsFollow) {
  const std::string args = " --prompt 'The model ' --max-tokens 16 --device cpu";
  const Result a = run_cli("generate --checkpoint " + run() + args);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_GT(a.out.size(), 1u);
  for (const char* what : {"time to first token", "tokens/s", "peak memory", "16 generated", "KV cache"})
    EXPECT_NE(a.err.find(what), std::string::npos) << what << " missing from:\n" << a.err;
  // The step directory itself gives the same text.
  const Result b = run_cli("generate --checkpoint " + run() + "/checkpoints/step_00000003" + args);
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  // A seed repeats a sampled output; another seed gives another.
  const std::string sampled = args + " --temperature 1.5 --top-k 50 --top-p 0.95 --repetition-penalty 1.1";
  const Result s1 = run_cli("generate --checkpoint " + run() + sampled + " --seed 5");
  const Result s2 = run_cli("generate --checkpoint " + run() + sampled + " --seed 5");
  const Result s3 = run_cli("generate --checkpoint " + run() + sampled + " --seed 6");
  ASSERT_EQ(s1.code, 0) << s1.err;
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_NE(s1.out, s3.out);
}

TEST_F(GenerateCli, ABatchOfPromptsPrintsEachInOrder) {
  test::TempDir tmp;
  std::ofstream(tmp.file("prompts.txt")) << "The model \n\nOnce upon a time\r\nA\n";
  const Result batch = run_cli("generate --checkpoint " + run() + " --prompts " + tmp.file("prompts.txt") +
                               " --max-tokens 12 --device cpu --stop zzz");
  ASSERT_EQ(batch.code, 0) << batch.err;
  const auto one = batch.out.find("[1] The model \n"), two = batch.out.find("[2] Once upon a time\n"),
             three = batch.out.find("[3] A\n");
  ASSERT_NE(one, std::string::npos) << batch.out;
  ASSERT_NE(two, std::string::npos) << batch.out;
  ASSERT_NE(three, std::string::npos) << batch.out;
  EXPECT_LT(one, two);
  EXPECT_LT(two, three);
  EXPECT_NE(batch.err.find("3 prompts"), std::string::npos) << batch.err;
  // Without --max-batch the prompts are one batch, the KV cache sized for them (Note [Generation memory]).
  EXPECT_NE(batch.err.find("batch up to 3 sequences (the prompts, at most 256)"), std::string::npos) << batch.err;
  const Result two_at_once = run_cli("generate --checkpoint " + run() + " --prompts " + tmp.file("prompts.txt") +
                                     " --max-tokens 12 --device cpu --stop zzz --max-batch 2");
  ASSERT_EQ(two_at_once.code, 0) << two_at_once.err;
  EXPECT_NE(two_at_once.err.find("batch up to 2 sequences (--max-batch)"), std::string::npos) << two_at_once.err;
  EXPECT_EQ(two_at_once.out, batch.out) << "greedy output is the same however the prompts are batched";
  // The first completion equals the prompt run alone.
  const Result alone =
      run_cli("generate --checkpoint " + run() + " --prompt 'The model ' --max-tokens 12 --device cpu");
  ASSERT_EQ(alone.code, 0) << alone.err;
  const size_t begin = one + std::string("[1] The model \n").size();
  EXPECT_EQ(batch.out.substr(begin, two - begin), alone.out + "\n");
}

TEST_F(GenerateCli, BadInputIsOneLineWithExitCode2) {
  const auto expect_user_error = [](const std::string& args, const std::string& needle) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  };
  const std::string ck = "generate --device cpu --checkpoint " + run();
  expect_user_error(ck + " --prompt x --max-tokens -1", "--max-tokens must be >= 0");
  expect_user_error(ck, "give --prompt TEXT or --prompts FILE");
  expect_user_error(ck + " --prompt '" + std::string(200, 'a') + "'", "shorten");
  expect_user_error(ck + " --prompt x --temperature -1", "temperature must be >= 0");
  expect_user_error(ck + " --prompt x --top-p 0", "top_p");
  expect_user_error(ck + " --prompt x --tokenizer " + dir_->file("no-such-tokenizer.json"), "no-such-tokenizer.json");
  expect_user_error(ck + " --prompts " + dir_->file("no-such-file.txt"), "cannot open");
  expect_user_error("generate --device tpu --prompt x --checkpoint " + run(), "--device 'tpu' is not a device");
  expect_user_error("generate --prompt x --checkpoint " + dir_->file("missing"), "not a directory");
  expect_user_error("generate --prompt x", "--checkpoint");
}

}  // namespace
}  // namespace tandem
