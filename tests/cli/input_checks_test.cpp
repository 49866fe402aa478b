// Input that used to be read as something else, now refused (exit 2, one line naming the cause and
// the fix) or read with a word: weights of another architecture, model keys under --init-from, a
// run directory that holds a run, DeepSpeed's ZeRO stage, binary files given to tokenize.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "cli_run.h"
#include "tandem/formats/safetensors.h"

namespace tandem {
namespace {

// Every tensor of a safetensors file (CPU copies).
std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  SafetensorsFile f(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& n : f.names()) out.emplace(n, f.tensor(n));
  return out;
}

namespace fs = std::filesystem;
using Result = test::CliResult;
using test::run_cli;

// Exit 2 and one error line, the last one, holding `needle` (log lines of the run may come before).
void expect_user_error(const std::string& args, const std::string& needle) {
  const Result r = run_cli(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
  const size_t at = r.err.find("tandem: error: ");
  ASSERT_NE(at, std::string::npos) << args << "\n" << r.err;
  const std::string line = r.err.substr(at);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << args << "\n" << r.err;
  EXPECT_NE(line.find(needle), std::string::npos) << args << "\n" << r.err;
}

// One short run of the tiny preset (4 layers, byte vocabulary), shared by the tests below.
class InputChecks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    const Result r = run_cli("train --steps 2 --run-dir " + run() + kSmall);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string run() { return dir_->file("run"); }
  static std::string checkpoint() { return run() + "/checkpoints/step_00000002"; }
  static constexpr const char* kSmall =
      " --device cpu --set train.seq_len=16 --set data.synthetic_bytes=20000 --set train.eval_every=0"
      " --set monitor.enabled=false --set train.progress=off";
  static test::TempDir* dir_;
};
test::TempDir* InputChecks::dir_ = nullptr;

TEST_F(InputChecks, ARunDirectoryIsNeverWrittenIntoTwice) {
  const auto metrics = test::read_text(run() + "/metrics.jsonl");
  expect_user_error("train --steps 1 --run-dir " + run() + kSmall, "already holds a run");
  expect_user_error("train --steps 1 --run-dir " + run() + kSmall, "--resume auto --run-dir " + run());
  EXPECT_EQ(test::read_text(run() + "/metrics.jsonl"), metrics);  // untouched
  const std::string other = dir_->file("notes");
  fs::create_directories(other);
  std::ofstream(other + "/todo.txt") << "keep me\n";
  expect_user_error("train --steps 1 --run-dir " + other + kSmall, "is not empty and holds no tandem run");
  EXPECT_EQ(test::read_text(other + "/todo.txt"), "keep me\n");
  fs::create_directories(dir_->file("empty"));
  const Result fresh = run_cli("train --steps 1 --run-dir " + dir_->file("empty") + kSmall);
  EXPECT_EQ(fresh.code, 0) << fresh.err;
  // --resume auto on a directory without a checkpoint yet is a fresh start, not a refusal.
  const Result start = run_cli("train --steps 1 --resume auto --run-dir " + dir_->file("auto") + kSmall);
  EXPECT_EQ(start.code, 0) << start.err;
}

TEST_F(InputChecks, ResumingWithFewerLayersNamesTheUnusedTensors) {
  const std::string copy = dir_->file("fewer");
  fs::copy(run(), copy, fs::copy_options::recursive);
  expect_user_error("train --steps 3 --resume " + copy + " --set model.n_layer=2",
                    "holds 18 tensor(s) the model does not use (model.layers.");
  EXPECT_FALSE(fs::exists(copy + "/checkpoints/step_00000003"));
}

TEST_F(InputChecks, FolderKeysApplyOrAreRefusedUnderInitFrom) {
  const std::string args = "train --steps 1 --init-from " + checkpoint() + kSmall;
  expect_user_error(args + " --run-dir " + dir_->file("i1") + " --set model.n_layer=2",
                    "model.n_layer=2 differs from " + checkpoint() + "'s 4: the folder's weights fix it");
  expect_user_error(args + " --run-dir " + dir_->file("i2") + " --set model.vocab_size=200",
                    "is below " + checkpoint() + "'s vocabulary of 256");
  const Result grown = run_cli(args + " --run-dir " + dir_->file("i3") + " --set model.vocab_size=320");
  ASSERT_EQ(grown.code, 0) << grown.err;
  EXPECT_NE(grown.err.find("model.vocab_size=320 grows"), std::string::npos) << grown.err;
  EXPECT_NE(grown.err.find("rows 256 .. 319"), std::string::npos) << grown.err;
  const auto saved = read_safetensors(dir_->file("i3") + "/checkpoints/step_00000001/model.safetensors");
  EXPECT_EQ(saved.at("model.embed_tokens.weight").size(0), 320);
  const auto before = read_safetensors(checkpoint() + "/model.safetensors").at("model.embed_tokens.weight");
  // The first 256 rows came from the folder (one step of training moves them only a little).
  EXPECT_LT((saved.at("model.embed_tokens.weight").narrow(0, 0, 256) - before).abs().max().item<double>(), 0.05);
}

TEST_F(InputChecks, AFolderWithTensorsOfAnotherFamilyIsRefused) {
  // A Qwen2-like folder relabelled llama: q/k/v biases the Llama decoder has no place for.
  const std::string folder = dir_->file("biased");
  fs::copy(checkpoint(), folder, fs::copy_options::recursive);
  auto tensors = read_safetensors(folder + "/model.safetensors");
  std::vector<std::pair<std::string, torch::Tensor>> all(tensors.begin(), tensors.end());
  all.emplace_back("model.layers.0.self_attn.q_proj.bias", torch::zeros({128}));
  write_safetensors(folder + "/model.safetensors", all, {});
  expect_user_error("train --steps 1 --init-from " + folder + " --run-dir " + dir_->file("b") + kSmall,
                    "holds 1 tensor(s) the model does not use (model.layers.0.self_attn.q_proj.bias)");
}

TEST_F(InputChecks, DeepSpeedsZeroStageIsMappedOrExplained) {
  std::ofstream(dir_->file("ds.json"))
      << R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})";
  const Result mapped = run_cli("config --deepspeed " + dir_->file("ds.json"));
  ASSERT_EQ(mapped.code, 0) << mapped.err;
  EXPECT_NE(mapped.out.find("zero_stage: 2"), std::string::npos) << mapped.out;
  std::ofstream(dir_->file("ds3.json")) << R"({"zero_optimization": {"stage": 3}})";
  const Result plain = run_cli("config --deepspeed " + dir_->file("ds3.json"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(plain.err.find("zero_optimization.stage=3: tandem's ZeRO (dist.zero_stage=2)"), std::string::npos)
      << plain.err;
  EXPECT_NE(plain.out.find("zero_stage: 0"), std::string::npos) << plain.out;
  std::ofstream(dir_->file("ds4.json")) << R"({"zero_optimization": {"stage": 4}})";
  expect_user_error("config --deepspeed " + dir_->file("ds4.json"), "zero_optimization.stage 4 is not a ZeRO stage");
}

TEST_F(InputChecks, TokenizeRefusesBinaryAndCountsStrayBytes) {
  std::string binary;
  for (int i = 0; i < 4096; ++i) binary.push_back(static_cast<char>((i * 37) & 0xFF));
  std::ofstream(dir_->file("photo.jpg.txt"), std::ios::binary) << binary;
  expect_user_error("tokenize --tokenizer byte --out " + dir_->file("t/train.bin") + " " + dir_->file("photo.jpg.txt"),
                    "does not look like text");
  EXPECT_FALSE(fs::exists(dir_->file("t/train.bin")));
  std::string text;
  for (int i = 0; i < 300; ++i) text += "plain words in a row. ";
  std::ofstream(dir_->file("latin1.txt"), std::ios::binary) << text << "caf\xe9\n";
  const Result r =
      run_cli("tokenize --tokenizer byte --out " + dir_->file("t/train.bin") + " " + dir_->file("latin1.txt"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("1 bytes of the inputs were malformed UTF-8"), std::string::npos) << r.err;
}

TEST_F(InputChecks, AnUnsupportedFamilyIsNamedWithTheCommandsThatReadFolders) {
  const std::string folder = dir_->file("other");
  fs::copy(checkpoint(), folder, fs::copy_options::recursive);
  std::ofstream(folder + "/config.json") << R"({"model_type": "mamba", "hidden_size": 128})";
  for (const std::string& cmd : {"generate --device cpu --prompt x --checkpoint " + folder,
                                 "train --device cpu --init-from " + folder + " --run-dir " + dir_->file("m")})
    expect_user_error(cmd, "model_type 'mamba' is not supported yet");
  const Result r = run_cli("generate --device cpu --prompt x --checkpoint " + folder);
  EXPECT_EQ(r.err.find("--init-from"), std::string::npos) << r.err;  // the message fits every command
}

}  // namespace
}  // namespace tandem
