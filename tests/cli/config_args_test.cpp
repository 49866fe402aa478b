// The configuration options every command shares (cli/config_args.h), parsed in-process: which
// options a command gets, each flag set through its key (with the flag named in the key's error),
// and Note [Config layers]'s order, whatever order the command line gives them in.

#include "tandem/cli/config_args.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"
#include "tandem/io/hf_config.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

using test::error_of;

// The options as `command` (training or not) registers them, parsed from `argv` (no program name).
ConfigArgs parse(const std::vector<std::string>& argv, bool training) {
  CLI::App app{"config args test"};
  ConfigArgs args;
  args.add_to(&app, training);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
  return args;
}

std::string origin_of(const ResolvedConfig& r, const std::string& key) {
  for (const auto& o : r.origins)
    if (o.key == key) return o.origin;
  return "(no origin for " + key + ")";
}

TEST(ConfigArgs, OnlyATrainingCommandTakesTheRunsOptions) {
  const std::vector<std::string> run = {"--steps", "7",           "--run-dir", "runs/x",       "--metrics-port",
                                        "9100",    "--dashboard", "8080",      "--tensorboard"};
  const Config c = parse(run, true).resolve("");
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.run_dir, "runs/x");
  EXPECT_EQ(c.monitor.metrics_port, 9100);
  EXPECT_EQ(c.monitor.dashboard_port, 8080);
  EXPECT_TRUE(c.monitor.tensorboard);
  // `inspect` and `config` have no run: each of these is an unknown option there.
  for (const char* flag : {"--steps", "--run-dir", "--metrics-port", "--dashboard"})
    EXPECT_THROW(parse({flag, "1"}, false), CLI::ParseError) << flag;
  EXPECT_THROW(parse({"--tensorboard"}, false), CLI::ParseError);
  // Without the flags, the defaults stay.
  const Config d = parse({}, true).resolve("");
  EXPECT_EQ(d.train.steps, Config().train.steps);
  EXPECT_FALSE(d.monitor.tensorboard);
  EXPECT_EQ(d.monitor.metrics_port, 0);
}

TEST(ConfigArgs, EveryCommandTakesTheModelAndDeviceFlags) {
  for (const bool training : {false, true}) {
    const Config c = parse({"-p", "125M", "--device", "cuda:1"}, training).resolve("");
    EXPECT_EQ(c.model.preset, "125M");
    EXPECT_EQ(c.train.device.kind, DeviceSpec::Kind::kCuda);
    EXPECT_EQ(c.train.device.index, 1);
    EXPECT_EQ(parse({"--preset", "tiny", "--device", "cpu"}, training).resolve("").train.device.kind,
              DeviceSpec::Kind::kCpu);
  }
}

// A flag's text goes through its key: a value the key cannot read names the flag, a value out of
// the key's range is refused by the key's check.
TEST(ConfigArgs, AFlagsValueIsCheckedAsItsKeys) {
  const auto refusal = [](const std::vector<std::string>& argv) {
    const ConfigArgs args = parse(argv, true);
    return error_of([&] { args.resolve(""); });
  };
  EXPECT_NE(refusal({"--steps", "-5"}).find("train.steps must be >= 0, got -5"), std::string::npos);
  EXPECT_NE(refusal({"--metrics-port", "-3"}).find("monitor.metrics_port"), std::string::npos);
  const std::string unreadable = refusal({"--dashboard", "x"});
  EXPECT_EQ(unreadable.rfind("--dashboard: ", 0), 0u) << unreadable;
  EXPECT_EQ(refusal({"--steps", "many"}).rfind("--steps: ", 0), 0u);
  EXPECT_NE(refusal({"--device", "tpu"}).find("--device"), std::string::npos);
  EXPECT_NE(refusal({"-p", "tinny"}).find("did you mean 'tiny'"), std::string::npos);
  // --set names itself, and a malformed assignment says what it expects.
  EXPECT_EQ(refusal({"--set", "train.steps=many"}).rfind("--set: ", 0), 0u);
  EXPECT_NE(refusal({"--set", "train.steps=-1"}).find("train.steps must be >= 0"), std::string::npos);
  EXPECT_NE(refusal({"--set", "train.steps"}).find("--set expects KEY=VALUE"), std::string::npos);
}

TEST(ConfigArgs, FilesMustExistWhenTheCommandLineIsParsed) {
  test::TempDir dir;
  EXPECT_THROW(parse({"-c", dir.file("missing.yaml")}, false), CLI::ValidationError);
  EXPECT_THROW(parse({"--deepspeed", dir.file("missing.json")}, false), CLI::ValidationError);
  std::ofstream(dir.file("run.toml")) << "x = 1\n";
  const ConfigArgs args = parse({"-c", dir.file("run.toml")}, false);
  EXPECT_NE(error_of([&] { args.resolve(""); }).find("unknown extension"), std::string::npos);
}

// Note [Config layers]: checkpoint < --config files (in order) < --deepspeed < flags < --set.
TEST(ConfigArgs, LayersApplyInTheirOrderNotTheCommandLines) {
  test::TempDir dir;
  std::ofstream(dir.file("a.yaml")) << "train:\n  micro_batch: 2\n  grad_accum: 3\n  seq_len: 32\n";
  std::ofstream(dir.file("b.yaml")) << "train:\n  micro_batch: 5\n  steps: 40\n";
  std::ofstream(dir.file("ds.json")) << R"({"train_micro_batch_size_per_gpu": 6})";
  // --set before the flag and --deepspeed before -c on the command line: neither changes the order.
  const ConfigArgs args = parse({"--set", "train.steps=9", "--steps", "5", "--deepspeed", dir.file("ds.json"), "-c",
                                 dir.file("a.yaml"), "-c", dir.file("b.yaml")},
                                true);
  const Config c = args.resolve("");
  EXPECT_EQ(c.train.steps, 9);        // --set over the flag over b.yaml
  EXPECT_EQ(c.train.micro_batch, 6);  // --deepspeed over b.yaml over a.yaml
  EXPECT_EQ(c.train.grad_accum, 3);   // a.yaml alone sets it
  EXPECT_EQ(c.train.seq_len, 32);
  // Without the DeepSpeed file, the later -c wins.
  EXPECT_EQ(parse({"-c", dir.file("a.yaml"), "-c", dir.file("b.yaml")}, false).resolve("").train.micro_batch, 5);
  EXPECT_EQ(parse({"-c", dir.file("b.yaml"), "-c", dir.file("a.yaml")}, false).resolve("").train.micro_batch, 2);
  // Each recipe key names the layer its value came from.
  std::ofstream(dir.file("lr.yaml")) << "optim:\n  lr: 2e-4\n  beta2: 0.9\n";
  const ResolvedConfig r = parse({"-c", dir.file("lr.yaml"), "--set", "optim.lr=1e-3"}, false).resolve_layers("");
  EXPECT_DOUBLE_EQ(r.config.optim.lr, 1e-3);
  EXPECT_EQ(origin_of(r, "optim.lr"), "--set");
  EXPECT_EQ(origin_of(r, "optim.beta2"), dir.file("lr.yaml"));
  EXPECT_EQ(origin_of(r, "optim.weight_decay"), "recipe");
}

// A resumed run's checkpoint config is the lowest layer: what the command line gives wins over it.
TEST(ConfigArgs, AResumedCheckpointsConfigIsTheLowestLayer) {
  test::TempDir ckpt, dir;
  std::ofstream(ckpt.file("tandem.yaml")) << "train:\n  steps: 11\n  micro_batch: 3\n  grad_accum: 4\n";
  std::ofstream(dir.file("run.yaml")) << "train:\n  micro_batch: 7\n";
  const Config c = parse({"-c", dir.file("run.yaml"), "--steps", "20"}, true).resolve(ckpt.path());
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_EQ(c.train.micro_batch, 7);
  EXPECT_EQ(c.train.grad_accum, 4);  // from the checkpoint
  EXPECT_EQ(parse({}, true).resolve(ckpt.path()).train.steps, 11);
  EXPECT_NE(error_of([&] { parse({}, true).resolve(dir.file("no-checkpoint")); }).find("no-checkpoint"),
            std::string::npos);
}

TEST(ConfigArgs, InitFromChoosesTheRecipeByTheFoldersModel) {
  test::TempDir folder;
  std::ofstream(folder.file("config.json")) << hf_config_json(preset_spec("125M"));
  const ResolvedConfig r = parse({"--init-from", folder.path()}, false).resolve_layers("");
  EXPECT_EQ(r.config.model.init_from, folder.path());
  EXPECT_EQ(r.model, "model.init_from " + folder.path());
  EXPECT_EQ(r.model_params, preset_spec("125M").num_params_unpadded());
  test::TempDir empty;
  EXPECT_NE(error_of([&] {
              parse({"--init-from", empty.path()}, false).resolve("");
            }).find("config.json"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
