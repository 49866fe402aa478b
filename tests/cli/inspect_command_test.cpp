// `tandem inspect` in-process (cli/inspect_command.h): the model's lines (shape, what a family adds
// to Llama's decoder, tensor-core alignment), the memory estimate for the configured batch, and
// with --plan the offload plan against the capacities given, its layout checks and its refusal.

#include "tandem/cli/inspect_command.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"
#include "command_run.h"
#include "tandem/core/strings.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

using test::error_of;

using Inspected = test::CommandRun;

Inspected inspect(const std::vector<std::string>& argv) { return test::run_command<InspectCommand>(argv); }

bool has(const Inspected& r, const std::string& text) { return r.out.find(text) != std::string::npos; }

TEST(InspectCommand, IsChosenOnlyWhenTheCommandLineNamesIt) {
  CLI::App app{"inspect test"};
  app.add_subcommand("other", "another command");
  InspectCommand command(app);
  std::vector<std::string> other = {"other"};
  app.parse(other);
  EXPECT_FALSE(command.chosen());
  CLI::App app2{"inspect test"};
  InspectCommand named(app2);
  std::vector<std::string> args = {"inspect"};
  app2.parse(args);
  EXPECT_TRUE(named.chosen());
}

TEST(InspectCommand, ShowsTheModelItsParametersAndTheEstimateOfTheBatch) {
  const Inspected r = inspect(
      {"inspect", "-p", "tiny", "--device", "cpu", "--set", "train.seq_len=32", "--set", "train.micro_batch=4"});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  const ModelSpec s = preset_spec("tiny");
  EXPECT_EQ(r.out.rfind("model tiny (llama): 4 layers, d_model 128, d_ff 384, vocab 256 (padded to 256), tied "
                        "embeddings\n",
                        0),
            0u)
      << r.out;
  EXPECT_TRUE(has(r, "attention: 4 heads, 2 key/value heads, head_dim 32, RoPE theta 10000, max_seq_len 128\n"))
      << r.out;
  EXPECT_FALSE(has(r, "decoder parts:")) << "Llama's own decoder adds nothing\n" << r.out;
  EXPECT_TRUE(has(r, "(" + std::to_string(s.num_params_unpadded()) + "; " + std::to_string(s.num_params()) +
                         " as stored with vocabulary padding)"))
      << r.out;
  EXPECT_TRUE(has(r, "layer.0 .. layer.3")) << r.out;
  EXPECT_TRUE(has(r, "head (norm; tied lm_head)")) << r.out;
  EXPECT_TRUE(has(r, "every matrix dimension is a multiple of 8 (bf16/fp16) and of 16 (fp8)")) << r.out;
  EXPECT_TRUE(has(r, "training recipe: ")) << r.out;
  EXPECT_TRUE(has(r, "memory estimate for training: micro-batch 4 x 32 tokens, fp32, activation checkpointing off"))
      << r.out;
  EXPECT_TRUE(has(r, "CPU (device)")) << r.out;
  // The loader's prefetched batches: data.prefetch (2) x inputs and targets x 4 x 32 int64 tokens.
  const std::string prefetched = r.out.substr(r.out.find("prefetched batches"));
  EXPECT_NE(prefetched.substr(0, prefetched.find('\n')).find(format_bytes(2.0 * 2 * 4 * 32 * 8)), std::string::npos)
      << prefetched;
  EXPECT_FALSE(has(r, "the plan fits"));  // no --plan
}

TEST(InspectCommand, WritesTheModelsHfConfigForAPeer) {
  test::TempDir dir;
  const std::string path = dir.file("config.json");
  const Inspected r =
      inspect({"inspect", "-p", "tiny", "--device", "cpu", "--set", "model.tie_embeddings=false", "--hf-config", path});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"hidden_size\": 128"), std::string::npos) << json;
  EXPECT_NE(json.find("\"num_hidden_layers\": 4"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tie_word_embeddings\": false"), std::string::npos) << json;
}

TEST(InspectCommand, TheSequenceDefaultsToTheModelsContextAndCheckpointingIsShown) {
  const Inspected r = inspect({"inspect", "--device", "cpu", "--set", "model.checkpointing=true", "--set",
                               "train.precision=bf16", "--set", "model.max_seq_len=96"});
  ASSERT_EQ(r.error, "");
  EXPECT_TRUE(has(r, "micro-batch 16 x 96 tokens, bf16, activation checkpointing on")) << r.out;
}

// What a family adds to Llama's decoder, from an HF folder's config.json (no weights needed).
std::string parts_line(const std::string& config_json) {
  test::TempDir folder;
  std::ofstream(folder.file("config.json")) << config_json;
  const Inspected r = inspect({"inspect", "--device", "cpu", "--init-from", folder.path()});
  EXPECT_EQ(r.error, "") << config_json;
  const auto at = r.out.find("decoder parts: ");
  return at == std::string::npos ? "(none)" : r.out.substr(at, r.out.find('\n', at) - at);
}

TEST(InspectCommand, NamesWhatEachFamilyAddsToLlamasDecoder) {
  const std::string shape =
      R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128)";
  EXPECT_EQ(parts_line(R"({"model_type": "qwen2", )" + shape + "}"), "decoder parts: q/k/v biases");
  EXPECT_EQ(parts_line(R"({"model_type": "llama", "mlp_bias": true, "attention_bias": true, )" + shape + "}"),
            "decoder parts: biases");
  EXPECT_EQ(
      parts_line(R"({"model_type": "llama", "rope_scaling": {"rope_type": "linear", "factor": 2.0}, )" + shape + "}"),
      "decoder parts: RoPE scaled x2");
  EXPECT_EQ(parts_line(R"({"model_type": "phi3", "partial_rotary_factor": 0.5, "sliding_window": 64, )" + shape + "}"),
            "decoder parts: RoPE on 0.5 of each head, sliding window 64 (every layer)");
  EXPECT_EQ(parts_line(R"({"model_type": "gemma", "head_dim": 16, )" + shape + "}"),
            "decoder parts: (1 + w) RMSNorm, GeGLU, embeddings x sqrt(d_model)");
  EXPECT_EQ(parts_line(R"({"model_type": "gemma2", "head_dim": 16, "sliding_window": 32, )" + shape + "}"),
            "decoder parts: (1 + w) RMSNorm, GeGLU, embeddings x sqrt(d_model), sliding window 32 (some layers), "
            "norms after attention and feed-forward, scores capped at 50, logits capped at 30");
  EXPECT_EQ(parts_line(R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
                           "n_positions": 128})"),
            "decoder parts: biases, LayerNorm, GELU feed-forward, learned positions");
  EXPECT_EQ(parts_line(R"({"model_type": "llama", )" + shape + "}"), "(none)");
}

TEST(InspectCommand, DimensionsOffTheTensorCoreGridAreNamed) {
  // d_model 104 (a multiple of 8, not of 16) and head_dim 26 (not of 8).
  const Inspected r = inspect({"inspect", "--device", "cpu", "--set", "model.d_model=104"});
  ASSERT_EQ(r.error, "");
  EXPECT_TRUE(has(r, "not a multiple of 8 (bf16/fp16 tensor cores): ")) << r.out;
  EXPECT_TRUE(has(r, "d_model and head_dim cannot be padded without changing the model")) << r.out;
  EXPECT_FALSE(has(r, "every matrix dimension is a multiple of 8")) << r.out;
  EXPECT_FALSE(has(r, "not a multiple of 16 (fp8)")) << "the fp8 lines only follow a clean bf16 grid\n" << r.out;
}

TEST(InspectCommand, ThePlanIsCheckedAgainstTheCapacitiesGiven) {
  const std::vector<std::string> plan = {"inspect", "-p",           "tiny", "--device",      "cpu",
                                         "--plan",  "--gpu-memory", "80",   "--host-memory", "64"};
  const Inspected r = inspect(plan);
  ASSERT_EQ(r.error, "") << r.out;
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r, "GPU: " + format_bytes(80.0 * (1 << 30)) +
                         " (--gpu-memory); host: " + format_bytes(64.0 * (1 << 30)) + " available (--host-memory)"))
      << r.out;
  EXPECT_TRUE(has(r, "offload.update_split=auto: 4 of 4 decoder blocks GPU-updated, the most that fit")) << r.out;
  EXPECT_TRUE(has(r, "the plan fits\n")) << r.out;
  EXPECT_FALSE(has(r, "memory estimate for training")) << "--plan replaces the estimate\n" << r.out;
  // A given split is taken as given.
  std::vector<std::string> half = plan;
  half.insert(half.end(), {"--set", "offload.update_split=0.5"});
  const Inspected given = inspect(half);
  EXPECT_TRUE(has(given, "offload.update_split=0.5: 2 of 4 decoder blocks GPU-updated")) << given.out;
  // Without --gpu-memory, with the CPU as the device (a GPU, if any, is not asked), the default is
  // named as such.
  const Inspected fallback = inspect({"inspect", "--device", "cpu", "--plan", "--host-memory", "64"});
  const std::string default_gpu = " (train.device=cpu: default, set with --gpu-memory)";
  EXPECT_TRUE(has(fallback, "GPU: " + format_bytes(80.0 * (1 << 30)) + default_gpu)) << fallback.out;
  // A GPU too small for the plan: the plan is printed, then refused.
  const Inspected tight =
      inspect({"inspect", "-p", "tiny", "--device", "cpu", "--plan", "--gpu-memory", "0.0001", "--host-memory", "64"});
  EXPECT_NE(tight.error, "") << tight.out;
  EXPECT_TRUE(has(tight, "budget: GPU")) << tight.out;
  EXPECT_FALSE(has(tight, "the plan fits")) << tight.out;
}

// Where fp32 m and v cap the GPU-updated Blocks, the plan says how many bf16 ones would let fit;
// with bf16 device states already (bf16 host states resolve them so) it says nothing more.
TEST(InspectCommand, ThePlanNamesTheBlocksThatBf16DeviceStatesWouldFit) {
  const std::vector<std::string> plan = {"inspect", "-p", "1B", "--device", "cpu", "--plan", "--gpu-memory", "12",
                                         "--host-memory", "64", "--set", "offload.optimizer=cpu",
                                         "--set", "train.micro_batch=1", "--set", "train.seq_len=512",
                                         "--set", "train.precision=bf16", "--set", "model.checkpointing=true"};
  const Inspected fp32 = inspect(plan);
  ASSERT_EQ(fp32.error, "") << fp32.out;
  const std::string hint = "with optim.device_state_dtype=bf16 (their m and v in bf16) ";
  const size_t at = fp32.out.find(hint);
  ASSERT_NE(at, std::string::npos) << fp32.out;
  const size_t first = fp32.out.find("offload.update_split=auto: ");
  const long fit = std::stol(fp32.out.substr(first + 27)), more = std::stol(fp32.out.substr(at + hint.size()));
  EXPECT_GT(more, fit) << fp32.out;
  std::vector<std::string> bf16 = plan;
  bf16.insert(bf16.end(), {"--set", "optim.device_state_dtype=bf16"});
  const Inspected with = inspect(bf16);
  EXPECT_TRUE(has(with, "offload.update_split=auto: " + std::to_string(more) + " of 24 decoder blocks GPU-updated"))
      << "the hint's count is the plan's with that setting\n" << with.out;
  EXPECT_FALSE(has(with, hint)) << with.out;
  bf16.back() = "optim.state_dtype=bf16";
  EXPECT_FALSE(has(inspect(bf16), hint));
}

TEST(InspectCommand, APlanOfSeveralRanksNeedsALayoutThatDividesThem) {
  const std::vector<std::string> base = {"inspect", "-p",           "tiny", "--device",      "cpu",
                                         "--plan",  "--gpu-memory", "80",   "--host-memory", "64"};
  std::vector<std::string> two = base;
  two.insert(two.end(), {"--ranks", "2", "--set", "dist.zero_stage=2"});
  const Inspected r = inspect(two);
  ASSERT_EQ(r.error, "") << r.out;
  EXPECT_TRUE(has(r, "2 ranks on one host, one GPU each")) << r.out;
  // Two pipeline stages on two ranks: a plan per stage, the cut taken as even.
  std::vector<std::string> staged = base;
  staged.insert(staged.end(),
                {"--ranks", "2", "--set", "dist.pipeline_stages=2", "--set", "model.tie_embeddings=false"});
  const Inspected stages = inspect(staged);
  ASSERT_EQ(stages.error, "") << stages.out;
  EXPECT_TRUE(has(stages, "dist.pipeline_cut is the partitioner's at run time, planned here as even")) << stages.out;
  size_t plans = 0;
  for (size_t at = stages.out.find("offload.update_split=auto"); at != std::string::npos;
       at = stages.out.find("offload.update_split=auto", at + 1))
    ++plans;
  EXPECT_EQ(plans, 2u) << stages.out;
  std::vector<std::string> uneven = base;
  uneven.insert(uneven.end(),
                {"--ranks", "3", "--set", "dist.pipeline_stages=2", "--set", "model.tie_embeddings=false"});
  EXPECT_NE(inspect(uneven).error.find("--ranks 3 is not a multiple of the 2 pipeline stages"), std::string::npos);
  std::vector<std::string> automatic = base;
  automatic.insert(automatic.end(),
                   {"--ranks", "2", "--set", "dist.pipeline_stages=auto", "--set", "model.tie_embeddings=false"});
  EXPECT_NE(inspect(automatic).error.find("--plan with dist.pipeline_stages=auto needs the cut"), std::string::npos);
}

TEST(InspectCommand, CountsAndMemoriesMustBePositive) {
  for (const std::vector<std::string>& argv :
       std::vector<std::vector<std::string>>{{"inspect", "--ranks", "0"},
                                             {"inspect", "--gpu-memory", "0"},
                                             {"inspect", "--host-memory", "-1"},
                                             {"inspect", "--partition-ranks", "0"}}) {
    CLI::App app{"inspect test"};
    InspectCommand command(app);
    std::vector<std::string> reversed(argv.rbegin(), argv.rend());
    EXPECT_THROW(app.parse(reversed), CLI::ParseError) << argv[1];
  }
}

}  // namespace
}  // namespace tandem
