// `tandem bench step` (bench/step_bench.h) on the CPU with the tiny preset: the result line and its
// JSON (tokens/s and model TFLOP/s from the median of the timed steps), the sequence length's
// default, checkpointing, the HF config written for peers, and its refusals.

#include "tandem/bench/step_bench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "tandem/io/hf_config.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

using nlohmann::json;

Config tiny_bench(int64_t steps, int64_t batch, int64_t seq) {
  Config c;
  c.model.preset = "tiny";
  c.train.device.kind = DeviceSpec::Kind::kCpu;
  c.train.steps = steps;
  c.train.micro_batch = batch;
  c.train.seq_len = seq;
  return c;
}

struct Ran {
  int code = -1;
  std::string out;
  std::vector<json> lines;  ///< of the JSON file
};

Ran run(const Config& c, const std::string& json_path, const std::string& model_json = "") {
  Ran r;
  testing::internal::CaptureStdout();
  r.code = run_step_bench(c, json_path, model_json);
  r.out = testing::internal::GetCapturedStdout();
  std::istringstream in(test::read_text(json_path));
  for (std::string line; std::getline(in, line);) r.lines.push_back(json::parse(line));
  return r;
}

// The milliseconds printed for each "step N: X ms (loss L)" line, and the losses.
void step_lines(const std::string& out, std::vector<std::string>* ms, std::vector<std::string>* losses,
                std::vector<bool>* untimed) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("step ", 0) != 0) continue;
    const size_t colon = line.find(": "), ms_at = line.find(" ms (loss "), close = line.find(')');
    ms->push_back(line.substr(colon + 2, ms_at - colon - 2));
    losses->push_back(line.substr(ms_at + 10, close - ms_at - 10));
    untimed->push_back(line.find(" untimed") != std::string::npos);
  }
}

TEST(StepBench, ReportsTheMedianOfTheTimedStepsAsTokensAndModelFlops) {
  test::TempDir dir;
  const Ran r = run(tiny_bench(5, 2, 16), dir.file("step.jsonl"));
  EXPECT_EQ(r.code, 0);
  ASSERT_EQ(r.lines.size(), 1u) << r.out;
  const json& j = r.lines[0];
  const ModelSpec spec = preset_spec("tiny");
  EXPECT_EQ(j["bench"], "step");
  EXPECT_EQ(j["model"], spec.name);
  EXPECT_EQ(j["params"].get<double>(), double(spec.num_params_unpadded()));
  EXPECT_EQ(j["batch"], 2);
  EXPECT_EQ(j["seq"], 16);
  EXPECT_EQ(j["checkpointing"], false);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["peak_device_bytes"], 0) << "no device memory on the CPU";
  const double med = j["median_step_s"];
  ASSERT_GT(med, 0.0);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 2.0 * 16 / med);
  EXPECT_DOUBLE_EQ(j["model_tflops"].get<double>(), 6.0 * double(spec.num_params_unpadded()) * 32 / med / 1e12);
  // Near ln(256) for an untrained byte-level model.
  EXPECT_NEAR(j["loss"].get<double>(), std::log(256.0), 1.0);

  std::vector<std::string> ms, losses;
  std::vector<bool> untimed;
  step_lines(r.out, &ms, &losses, &untimed);
  ASSERT_EQ(ms.size(), 5u) << r.out;
  EXPECT_EQ(untimed, (std::vector<bool>{true, true, false, false, false})) << r.out;
  // The upper median of the three timed steps, as printed (%.1f).
  std::vector<double> timed = {std::stod(ms[2]), std::stod(ms[3]), std::stod(ms[4])};
  std::sort(timed.begin(), timed.end());
  char want[32];
  std::snprintf(want, sizeof want, "%.1f", med * 1e3);
  EXPECT_EQ(std::stod(want), timed[1]) << r.out;
  // No optimizer and gradients zeroed each step: every step computes the same loss.
  for (const auto& l : losses) EXPECT_EQ(l, losses[0]) << r.out;
  char loss_text[32];
  std::snprintf(loss_text, sizeof loss_text, "%.4f", j["loss"].get<double>());
  EXPECT_EQ(losses.back(), loss_text);
  EXPECT_NE(r.out.find("forward+backward only: " + spec.name + ", B=2, T=16: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" tok/s, "), std::string::npos) << r.out;
}

TEST(StepBench, TheSequenceDefaultsToTheModelsContextAndResultsAreAppended) {
  test::TempDir dir;
  const std::string path = dir.file("step.jsonl");
  Config c = tiny_bench(3, 1, 0);
  c.model.max_seq_len = 48;
  run(c, path);
  const Ran r = run(c, path);
  ASSERT_EQ(r.lines.size(), 2u) << "the second run adds a line";
  EXPECT_EQ(r.lines[0]["seq"], 48);
  EXPECT_EQ(r.lines[1]["seq"], 48);
  EXPECT_EQ(r.lines[0]["loss"], r.lines[1]["loss"]) << "train.seed decides the weights and the tokens";
  EXPECT_NE(r.out.find(", B=1, T=48: "), std::string::npos) << r.out;
}

TEST(StepBench, CheckpointingRecomputesTheSameLossAndSaysSo) {
  test::TempDir dir;
  Config c = tiny_bench(3, 2, 16);
  const Ran plain = run(c, dir.file("plain.jsonl"));
  c.model.checkpointing = true;
  const Ran recomputed = run(c, dir.file("ckpt.jsonl"));
  ASSERT_EQ(recomputed.lines.size(), 1u);
  EXPECT_EQ(recomputed.lines[0]["checkpointing"], true);
  EXPECT_EQ(recomputed.lines[0]["loss"], plain.lines[0]["loss"]);
  EXPECT_NE(recomputed.out.find(", B=2, T=16, checkpointing: "), std::string::npos) << recomputed.out;
  EXPECT_EQ(plain.out.find("checkpointing"), std::string::npos) << plain.out;
}

TEST(StepBench, WritesTheModelsHfConfigForPeers) {
  test::TempDir dir;
  Config c = tiny_bench(3, 1, 8);
  c.model.n_layer = 2;
  run(c, dir.file("step.jsonl"), dir.file("config.json"));
  EXPECT_EQ(test::read_text(dir.file("config.json")), hf_config_json(resolve_model_spec(c.model)));
  EXPECT_EQ(json::parse(test::read_text(dir.file("config.json")))["num_hidden_layers"], 2);
}

TEST(StepBench, NoJsonPathWritesNoFile) {
  test::TempDir dir;
  testing::internal::CaptureStdout();
  EXPECT_EQ(run_step_bench(tiny_bench(3, 1, 8), ""), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("forward+backward only"), std::string::npos);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(StepBench, AnUnwritableJsonPathIsRefusedBeforeAnythingRuns) {
  test::TempDir dir;
  const std::string model_json = dir.file("model.json");
  const std::string err =
      test::error_of([&] { run_step_bench(tiny_bench(3, 1, 8), dir.file("missing/folder/step.jsonl"), model_json); });
  EXPECT_NE(err.find("cannot write --json"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(model_json)) << "nothing written before the refusal";
}

TEST(StepBench, FewerThanThreeStepsOrAMissingGpuAreRefused) {
  test::TempDir dir;
  for (const int64_t steps : {0, 2}) {
    const std::string err = test::error_of([&] { run_step_bench(tiny_bench(steps, 1, 8), dir.file("s.jsonl")); });
    EXPECT_NE(err.find("bench step needs --steps >= 3 (two untimed), got " + std::to_string(steps)), std::string::npos)
        << err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("s.jsonl")));
  if (!torch::cuda::is_available()) {
    Config c = tiny_bench(3, 1, 8);
    c.train.device = DeviceSpec::parse("cuda", "train.device");
    const std::string err = test::error_of([&] { run_step_bench(c, ""); });
    EXPECT_NE(err.find("no CUDA device is visible"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace tandem
