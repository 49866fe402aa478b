// Block placement through the whole trainer on the CPU (Note [Block placement]): a static
// placement trains like none, the policies report in metrics.jsonl and summary.json, and bad
// placement settings are refused up front, naming the key.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

// amx-moe-tiny has 6 Blocks: embedding, 2 dense layers, 2 MoE layers, head.
Config placed_run(const std::string& dir, int64_t steps, PlacementPolicyKind policy) {
  Config c = test::tiny_cpu_config(dir, steps);
  c.model.preset = "amx-moe-tiny";
  c.train.micro_batch = 4;
  c.train.seq_len = 32;
  c.train.save_final = false;
  c.offload.optimizer = OffloadTarget::kCpu;
  c.placement.policy = policy;
  return c;
}

// The step rows of metrics.jsonl (evaluation rows have no step_time_s).
std::vector<nlohmann::json> step_rows(const std::string& dir) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(test::read_text(dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.contains("step_time_s")) rows.push_back(std::move(j));
  }
  return rows;
}

nlohmann::json summary_placement(const std::string& dir) {
  const auto s = nlohmann::json::parse(test::read_text(dir + "/summary.json"));
  return s.contains("placement") ? s.at("placement") : nlohmann::json();
}

TEST(PlacementTrainer, StaticPlacementTrainsLikeNone) {
  test::TempDir off_dir, placed_dir;
  const Config off = placed_run(off_dir.path(), 10, PlacementPolicyKind::kOff);
  Config placed = placed_run(placed_dir.path(), 10, PlacementPolicyKind::kStatic);
  placed.placement.blocks = StaticBlocks::parse("GCCGGG");
  const auto a = train(off, {});
  const auto b = train(placed, {});
  ASSERT_EQ(a.losses.size(), 10u);
  ASSERT_EQ(b.losses.size(), a.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(b.losses[i], a.losses[i], 1e-5 * std::abs(a.losses[i])) << "step " << i + 1;

  const auto rows = step_rows(placed_dir.path());
  ASSERT_EQ(rows.size(), 10u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.value("placement", ""), "GCCGGG") << r.dump();
    EXPECT_EQ(r.value("placement_cpu_blocks", -1), 2) << r.dump();
  }
  const auto p = summary_placement(placed_dir.path());
  ASSERT_TRUE(p.is_object()) << "summary.json has no placement";
  EXPECT_EQ(p.value("policy", ""), "static");
  // Without a policy the rows carry no placement.
  for (const auto& r : step_rows(off_dir.path())) EXPECT_FALSE(r.contains("placement")) << r.dump();
}

TEST(PlacementTrainer, ThresholdWithoutGpuReadingsNeverMoves) {
  test::TempDir dir;
  Config c = placed_run(dir.path(), 10, PlacementPolicyKind::kThreshold);
  c.placement.dwell_steps = 1;
  const auto s = train(c, {});
  EXPECT_EQ(s.losses.size(), 10u);
  const auto rows = step_rows(dir.path());
  ASSERT_EQ(rows.size(), 10u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.value("placement", ""), "GGGGGG") << r.dump();
    EXPECT_EQ(r.value("placement_cpu_blocks", -1), 0) << r.dump();
  }
  const auto p = summary_placement(dir.path());
  EXPECT_EQ(p.value("policy", ""), "threshold");
  EXPECT_EQ(p.value("moves", -1), 0);
}

TEST(PlacementTrainer, CostPolicyProfilesTheMovableBlocks) {
  test::TempDir dir;
  // Warm-up of 4 steps, then 2 probes (all-GPU, and the dense layers' group) of profile_steps each.
  Config c = placed_run(dir.path(), 12, PlacementPolicyKind::kCost);
  c.placement.movable = MovableBlocks::parse("1,2");
  const int64_t profile_end = 4 + 2 * c.placement.profile_steps;
  const auto s = train(c, {});
  EXPECT_EQ(s.losses.size(), 12u);
  for (const double l : s.losses) EXPECT_TRUE(std::isfinite(l));

  const auto p = summary_placement(dir.path());
  ASSERT_TRUE(p.is_object()) << "summary.json has no placement";
  EXPECT_EQ(p.value("policy", ""), "cost");
  ASSERT_TRUE(p.contains("costs")) << p.dump();
  const auto& costs = p.at("costs");
  ASSERT_EQ(costs.size(), 6u) << p.dump();
  for (size_t i = 0; i < costs.size(); ++i) {
    const bool movable = i == 1 || i == 2;
    EXPECT_EQ(costs[i].value("movable", !movable), movable) << "block " << i << ": " << costs[i].dump();
    if (movable) {
      EXPECT_GT(costs[i].value("gpu_s", 0.0), 0) << "block " << i << ": " << costs[i].dump();
      EXPECT_GT(costs[i].value("cpu_s", 0.0), 0) << "block " << i << ": " << costs[i].dump();
    }
  }

  const auto rows = step_rows(dir.path());
  ASSERT_EQ(rows.size(), 12u);
  for (const auto& r : rows) {
    const int64_t step = r.value("step", int64_t{0});
    if (step > profile_end)
      EXPECT_EQ(r.value("placement_policy", ""), "cost") << r.dump();
    else
      EXPECT_NE(r.value("placement_policy", ""), "cost") << r.dump();
    // Only the movable Blocks ever leave the GPU.
    const std::string placed = r.value("placement", "");
    ASSERT_EQ(placed.size(), 6u) << r.dump();
    EXPECT_EQ(placed.substr(3), "GGG") << r.dump();
    EXPECT_EQ(placed[0], 'G') << r.dump();
  }
}

TEST(PlacementTrainer, BadPlacementSettingsNameTheKey) {
  test::TempDir dir;
  const auto error = [&](const std::function<void(Config&)>& edit) {
    Config c = placed_run(dir.path(), 2, PlacementPolicyKind::kStatic);
    return test::error_of([&] {
      edit(c);  // an enum key's bad name is refused as it is set
      train(c, {});
    });
  };
  const auto expect_has = [](const std::string& message, const std::string& needle) {
    EXPECT_NE(message.find(needle), std::string::npos) << "'" << message << "' lacks '" << needle << "'";
  };
  expect_has(error([](Config& c) { apply_override(c, "placement.policy=bogus"); }), "placement.policy");
  expect_has(error([](Config& c) { c.offload.optimizer = OffloadTarget::kNone; }), "offload.optimizer=cpu");
  expect_has(error([](Config& c) { c.train.precision = Precision::kFp16; }), "train.precision=bf16");
  expect_has(error([](Config& c) { apply_override(c, "placement.blocks=CGGGGG"); }), "not movable");
  expect_has(error([](Config& c) { apply_override(c, "placement.blocks=GGG"); }), "GGG");
  expect_has(error([](Config& c) { apply_override(c, "placement.movable=0"); }), "not a decoder layer");
  expect_has(error([](Config& c) { apply_override(c, "placement.movable=9"); }), "placement.movable");
  expect_has(error([](Config& c) { apply_override(c, "placement.movable=x"); }), "placement.movable");
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(PlacementTrainer, CliRefusesABadPolicyInOneLine) {
  test::TempDir dir;
  const std::string cmd = test::cli_path() + " train -p amx-moe-tiny --steps 1 --run-dir " + dir.file("run") +
                          " --set offload.optimizer=cpu --set placement.policy=bogus >" + dir.file("out") + " 2>" +
                          dir.file("err");
  const int status = std::system(cmd.c_str());
  const std::string err = test::read_text(dir.file("err"));
  ASSERT_TRUE(WIFEXITED(status)) << cmd;
  EXPECT_EQ(WEXITSTATUS(status), 2) << err;
  EXPECT_EQ(lines(err), 1) << err;
  EXPECT_NE(err.find("placement.policy"), std::string::npos) << err;
  EXPECT_NE(err.find("bogus"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/metrics.jsonl")));
}

}  // namespace
}  // namespace tandem
