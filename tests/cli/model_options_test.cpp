// The model and sampling options that `tandem generate`, `serve` and `chat` share
// (cli/model_options.h), parsed in-process: each flag lands in its field, the defaults stay when a
// flag is absent, --checkpoint is required and --eager turns decode graphs off.

#include "tandem/cli/model_options.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tandem {
namespace {

void parse(CLI::App& app, const std::vector<std::string>& argv) {
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
}

TEST(ModelOptions, EachFlagSetsItsField) {
  CLI::App app{"model options test"};
  GenerationModelOptions m;
  add_model_options(&app, m);
  parse(app, {"--checkpoint", "runs/a", "--tokenizer", "byte", "--device", "cuda:1", "--dtype", "fp16",
              "--gpu-memory-gib", "12.5", "--eager"});
  EXPECT_EQ(m.checkpoint, "runs/a");
  EXPECT_EQ(m.tokenizer, "byte");
  EXPECT_EQ(m.device, "cuda:1");
  EXPECT_EQ(m.dtype, "fp16");
  EXPECT_DOUBLE_EQ(m.gpu_memory_gib, 12.5);
  EXPECT_FALSE(m.decode_graphs);
}

TEST(ModelOptions, AbsentFlagsKeepTheDefaultsAndTheCheckpointIsRequired) {
  {
    CLI::App app{"model options test"};
    GenerationModelOptions m;
    add_model_options(&app, m);
    parse(app, {"--checkpoint", "ckpt"});
    const GenerationModelOptions defaults;
    EXPECT_EQ(m.tokenizer, "");
    EXPECT_EQ(m.device, defaults.device);
    EXPECT_EQ(m.dtype, defaults.dtype);
    EXPECT_EQ(m.gpu_memory_gib, 0.0);
    EXPECT_TRUE(m.decode_graphs);  // graphs unless --eager
    EXPECT_EQ(m.max_batch, defaults.max_batch);
  }
  CLI::App app{"model options test"};
  GenerationModelOptions m;
  add_model_options(&app, m);
  EXPECT_THROW(parse(app, {"--device", "cpu"}), CLI::RequiredError);
  CLI::App typed{"model options test"};
  add_model_options(&typed, m);
  EXPECT_THROW(parse(typed, {"--checkpoint", "c", "--gpu-memory-gib", "lots"}), CLI::ConversionError);
}

TEST(ModelOptions, SamplingFlagsSetTheirParametersAndTheSeedSaysWhatItCounts) {
  CLI::App app{"sampling test"};
  SamplingParams s;
  add_sampling_options(&app, s, "reply");
  parse(app, {"--temperature", "0.7", "--top-k", "40", "--top-p", "0.9", "--repetition-penalty", "1.3", "--seed",
              "12345678901"});
  EXPECT_DOUBLE_EQ(s.temperature, 0.7);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_DOUBLE_EQ(s.top_p, 0.9);
  EXPECT_DOUBLE_EQ(s.repetition_penalty, 1.3);
  EXPECT_EQ(s.seed, 12345678901ull);  // the whole 64-bit range
  EXPECT_NE(app.get_option("--seed")->get_description().find("reply i uses seed + i"), std::string::npos)
      << app.get_option("--seed")->get_description();

  CLI::App other{"sampling test"};
  SamplingParams d;
  add_sampling_options(&other, d, "prompt");
  parse(other, {});
  const SamplingParams defaults;
  EXPECT_EQ(d.temperature, defaults.temperature);
  EXPECT_EQ(d.top_k, defaults.top_k);
  EXPECT_EQ(d.top_p, defaults.top_p);
  EXPECT_EQ(d.repetition_penalty, defaults.repetition_penalty);
  EXPECT_EQ(d.seed, defaults.seed);
  EXPECT_NE(other.get_option("--seed")->get_description().find("prompt i uses seed + i"), std::string::npos);
  CLI::App bad{"sampling test"};
  add_sampling_options(&bad, d, "prompt");
  EXPECT_THROW(parse(bad, {"--top-k", "2.5"}), CLI::ConversionError);
}

}  // namespace
}  // namespace tandem
