// The CLI as a user meets it: exit codes, one-line errors, and the default job's outputs.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "../test_util.h"
#include "cli_run.h"
#include "tandem/models/recipe.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

using Result = test::CliResult;
using test::run_cli;

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

void expect_user_error(const std::string& args, const std::string& needle) {
  const Result r = run_cli(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
  EXPECT_EQ(lines(r.err), 1) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  EXPECT_EQ(r.err.find("Exception raised from"), std::string::npos) << "stack trace leaked: " << r.err;
}

TEST(Cli, UserErrorsAreOneLineWithExitCode2) {
  test::TempDir dir;
  expect_user_error("train --set train.stpes=1", "did you mean 'train.steps'");
  expect_user_error("train -p tinny", "did you mean 'tiny'");
  expect_user_error("train --set data.path=" + dir.file("none.bin") + " --run-dir " + dir.file("r"), "cannot open");
  expect_user_error("train --resume " + dir.file("nothing"), "not a directory");
  expect_user_error("train --run-dir /proc/tandem-no --steps 1", "run directory");
  expect_user_error("train --init-from " + dir.path(), "config.json");
  expect_user_error("inspect --set train.precision=fp8", "must be one of");
  expect_user_error("--bogus", "--bogus");
  expect_user_error("train --resume auto", "--resume auto looks in the run directory");
  expect_user_error("report " + dir.path(), "no metrics.jsonl");
  expect_user_error("train --dashboard 70000", "TCP port");
  expect_user_error("dashboard " + dir.file("missing"), "not a directory");
  {
    std::ofstream(dir.file("bad.yaml")) << "train:\n  steps: 5\n  lr: 0.1\n";
    expect_user_error("train -c " + dir.file("bad.yaml"), "bad.yaml:3: unknown config key 'train.lr'");
  }
  {
    std::ofstream(dir.file("trunc.bin")) << "abc";
    expect_user_error("train --set data.path=" + dir.file("trunc.bin") + " --run-dir " + dir.file("r2"), "truncated");
  }
}

TEST(Cli, HelpInspectAndConfig) {
  Result h = run_cli("--help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("train"), std::string::npos);
  EXPECT_NE(h.out.find("inspect"), std::string::npos);
  Result i = run_cli("inspect -p 7B --set train.precision=bf16 --set model.checkpointing=true");
  EXPECT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("6.74 B"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("AdamW states"), std::string::npos) << i.out;
  Result k = run_cli("config --keys");
  EXPECT_EQ(k.code, 0);
  EXPECT_NE(k.out.find("train.grad_accum"), std::string::npos);
  Result c = run_cli("config --set train.steps=7");
  EXPECT_EQ(c.code, 0);
  EXPECT_NE(c.out.find("steps: 7"), std::string::npos) << c.out;
}

TEST(Cli, ShortTrainRunWritesItsRunDirectory) {
  test::TempDir dir;
  std::ofstream(dir.file("ds.json")) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "zero_optimization": {"stage": 3}, "bf16": {"enabled": false}})";
  const Result r = run_cli("train --steps 3 --run-dir " + dir.file("run") + " --deepspeed " + dir.file("ds.json") +
                           " --set train.seq_len=16 --set data.synthetic_bytes=20000 --device cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("zero_optimization.stage=3: tandem's ZeRO"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2 x 16 tokens x 2 accumulation"), std::string::npos) << r.err;
  std::ifstream m(dir.file("run/metrics.jsonl"));
  std::string all((std::istreambuf_iterator<char>(m)), {});
  EXPECT_EQ(lines(all), 5);  // 3 steps, the final evaluation, the final checkpoint
  EXPECT_TRUE(std::filesystem::exists(dir.file("run/checkpoints/step_00000003/model.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("run/summary.json")));
  // Resume the run directory for two more steps.
  const Result r2 = run_cli("train --resume " + dir.file("run") + " --steps 5");
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_NE(r2.err.find("resumed from"), std::string::npos) << r2.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("run/checkpoints/step_00000005/trainer_state.json")));
}

// Each refusal comes before the model is built or a file is read, so none of these takes long.
TEST(Cli, FlagsPassTheirKeysChecks) {
  test::TempDir dir;
  const std::string run = " --device cpu --run-dir " + dir.file("r");
  expect_user_error("train --steps -5" + run, "train.steps must be >= 0");
  expect_user_error("train --metrics-port -3" + run, "monitor.metrics_port");
  expect_user_error("train --dashboard x" + run, "--dashboard");
}

TEST(Cli, AModelLargerThanTheHostIsRefusedUpFront) {
  test::TempDir dir;
  const std::string run = " --run-dir " + dir.file("r") + " --set offload.host_memory_gib=16";
  // 13B without offload on the CPU: 16 bytes per parameter and activations, on a 16 GiB host.
  expect_user_error("train -p 13B --device cpu" + run, "GiB of host memory");
  expect_user_error("train -p 13B --device cpu --set offload.optimizer=cpu" + run, "GiB of host memory");
  expect_user_error("train -p 13B --device cpu --set offload.optimizer=cpu --set optim.state_dtype=bf16" + run,
                    "16.00 GiB is available");
  // The tiny model with a huge micro-batch or width: refused by the estimate, not by an allocation.
  expect_user_error("train --device cpu --set train.micro_batch=500000" + run, "lower train.micro_batch");
  expect_user_error("train --device cpu --set model.d_model=1000000 --set model.n_head=4" + run, "GiB of host memory");
  expect_user_error("train --device cpu --set model.d_model=100000000" + run, "model.d_model must be within");
  expect_user_error("train --device cpu --set train.micro_batch=100000000" + run, "train.micro_batch must be within");
  expect_user_error("inspect --set model.n_layer=1000000000000", "model.n_layer must be within");
}

TEST(Cli, DeepSpeedWithBothHalfPrecisionsIsRefused) {
  test::TempDir dir;
  std::ofstream(dir.file("ds.json")) << R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})";
  expect_user_error("config --deepspeed " + dir.file("ds.json"), "both fp16 and bf16 are enabled");
  std::ofstream(dir.file("ds0.json")) << R"({"gradient_accumulation_steps": 0, "train_batch_size": 8})";
  expect_user_error("config --deepspeed " + dir.file("ds0.json"), "must be a positive integer");
  std::ofstream(dir.file("ds1.json")) << R"({"scheduler": {"type": 3}})";
  expect_user_error("config --deepspeed " + dir.file("ds1.json"), "'scheduler.type' must be a string");
}

// A header with llm.c's shape (version, a count that fits the size) under a wrong magic is refused
// under data.format=auto, not read as raw tokens; a file of exactly T + 1 tokens is one window.
TEST(Cli, TokenFilesAreReadAsWhatTheyAre) {
  test::TempDir dir;
  {
    std::vector<int32_t> header(256, 0);
    header[0] = 12345678;  // damaged magic
    header[1] = 1;         // uint16 tokens
    header[2] = 1000;
    std::ofstream f(dir.file("bad.bin"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    const std::vector<uint16_t> tokens(1000, 7);
    f.write(reinterpret_cast<const char*>(tokens.data()), 2000);
  }
  expect_user_error("train --device cpu --set data.path=" + dir.file("bad.bin") + " --run-dir " + dir.file("r"),
                    "not an llm.c magic");
  {
    std::vector<uint16_t> tokens(17);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);
    std::ofstream(dir.file("one.bin"), std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), 2 * static_cast<std::streamsize>(tokens.size()));
  }
  const Result r = run_cli(
      "train --device cpu --steps 1 --set train.seq_len=16 --set train.micro_batch=1 "
      "--set data.val_fraction=0 --set train.eval_every=0 --set monitor.enabled=false "
      "--set data.path=" +
      dir.file("one.bin") + " --run-dir " + dir.file("r1"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("nanoGPT uint16 (no llm.c header; data.format=auto)"), std::string::npos) << r.err;
}

/// A recipe key's line of `tandem inspect`: "  optim.lr   0.0006   recipe".
struct RecipeLine {
  std::string value, origin;
};

RecipeLine recipe_line(const std::string& out, const std::string& key) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("  " + key + " ", 0) != 0) continue;
    std::istringstream fields(line);
    RecipeLine r;
    std::string k;
    fields >> k >> r.value >> std::ws;
    std::getline(fields, r.origin);
    return r;
  }
  return {"(no line for " + key + ")", ""};
}

double number(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

// Every preset on each data kind: `tandem inspect` shows the row of recipe_row for its parameter
// count, each value from the recipe, the warmup by the rule at the default 300 steps.
TEST(Cli, InspectShowsTheRecipeOfEveryPreset) {
  for (const auto& preset : preset_names()) {
    for (const DataKind kind : {DataKind::kSynthetic, DataKind::kReal}) {
      const std::string args = "inspect -p " + preset + (kind == DataKind::kReal ? " --set data.path=tokens.bin" : "");
      SCOPED_TRACE(args);
      const Result r = run_cli(args);
      ASSERT_EQ(r.code, 0) << r.err;
      const RecipeRow& row = recipe_row(preset_spec(preset).num_params_unpadded(), kind);
      EXPECT_NE(r.out.find(std::string("training recipe: ") + row.name + " ("), std::string::npos) << r.out;
      EXPECT_NE(r.out.find(std::string(" on ") + to_string(kind) + " data, 300 steps"), std::string::npos) << r.out;
      EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.lr").value), row.lr);
      EXPECT_EQ(recipe_line(r.out, "optim.warmup_steps").value, std::to_string(recipe_warmup_steps(row, 300)));
      EXPECT_EQ(recipe_line(r.out, "optim.schedule").value, to_string(row.schedule));
      EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.min_lr_ratio").value), row.min_lr_ratio);
      EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.beta1").value), row.beta1);
      EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.beta2").value), row.beta2);
      EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.eps").value), row.eps);
      EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.weight_decay").value), row.weight_decay);
      for (const auto& key : recipe_keys())
        EXPECT_EQ(recipe_line(r.out, key).origin.rfind("recipe", 0), 0u) << key << ": " << r.out;
    }
  }
}

// Note [Config layers]: --set, a YAML file and a DeepSpeed JSON each win over the recipe, in
// inspect (with the origin) and in `tandem config` (the resolved value).
TEST(Cli, UserValuesWinOverTheRecipe) {
  test::TempDir dir;
  const std::string real = "-p 125M --set data.path=tokens.bin --set train.steps=400";
  Result r = run_cli("inspect " + real);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.lr").value), 6e-4);
  EXPECT_EQ(recipe_line(r.out, "optim.warmup_steps").value, "40");

  r = run_cli("inspect " + real + " --set optim.lr=1e-3");
  EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.lr").value), 1e-3);
  EXPECT_EQ(recipe_line(r.out, "optim.lr").origin, "--set");

  std::ofstream(dir.file("run.yaml")) << "optim:\n  lr: 2e-4\n  warmup_steps: 5\n";
  r = run_cli("inspect " + real + " -c " + dir.file("run.yaml"));
  EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.lr").value), 2e-4);
  EXPECT_EQ(recipe_line(r.out, "optim.lr").origin, dir.file("run.yaml"));
  EXPECT_EQ(recipe_line(r.out, "optim.warmup_steps").value, "5");
  EXPECT_EQ(recipe_line(r.out, "optim.beta2").origin, "recipe");
  r = run_cli("inspect " + real + " -c " + dir.file("run.yaml") + " --set optim.lr=1e-3");
  EXPECT_EQ(recipe_line(r.out, "optim.lr").origin, "--set") << "--set wins over the file";

  std::ofstream(dir.file("ds.json"))
      << R"({"optimizer": {"type": "AdamW", "params": {"lr": 5e-5, "weight_decay": 0.01}}})";
  r = run_cli("inspect " + real + " --deepspeed " + dir.file("ds.json"));
  EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.lr").value), 5e-5);
  EXPECT_EQ(recipe_line(r.out, "optim.lr").origin, dir.file("ds.json"));
  EXPECT_DOUBLE_EQ(number(recipe_line(r.out, "optim.weight_decay").value), 0.01);

  // `tandem config` prints the resolved values.
  r = run_cli("config " + real);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto yaml_value = [&](const std::string& key) -> std::string {
    const std::string tag = "\n  " + key + ": ";
    const auto at = r.out.find(tag);
    if (at == std::string::npos) return "";
    const auto from = at + tag.size();
    return r.out.substr(from, r.out.find('\n', from) - from);
  };
  EXPECT_DOUBLE_EQ(number(yaml_value("lr")), 6e-4) << r.out;
  EXPECT_EQ(yaml_value("warmup_steps"), "40") << r.out;
  r = run_cli("config " + real + " --deepspeed " + dir.file("ds.json"));
  EXPECT_DOUBLE_EQ(number(yaml_value("lr")), 5e-5) << r.out;
}

// The default job, as `tandem train` runs it with no options (tiny, the generated corpus, 300
// steps): its recipe is 3e-3 with warmup 20, and it converges from about 5.5 to about 0.3.
TEST(Cli, TheDefaultJobConverges) {
  test::TempDir dir;
  const Result r = run_cli("train --run-dir " + dir.file("run") + " --set train.progress=off");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(dir.file("run/metrics.jsonl"));
  std::vector<double> losses, lrs;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && !j.contains("eval_loss")) {
      losses.push_back(j["loss"].get<double>());
      lrs.push_back(j["lr"].get<double>());
    }
  }
  ASSERT_FALSE(losses.empty());
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(losses.back(), 0.6) << "the default job should end near 0.3";
  const double peak = *std::max_element(lrs.begin(), lrs.end());
  EXPECT_NEAR(peak, 3e-3, 1e-9);
}

}  // namespace
}  // namespace tandem
