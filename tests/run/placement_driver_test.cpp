// Block placement's step-loop side (run/placement_driver.h) over an offload engine on the CPU and Blocks
// of chosen sizes: movable Blocks, static placements, the threshold rule (summed GPU power, cheapest
// Block first), the cost model's profile and its closed loop on a budget, the rows and the summary.
#include "tandem/run/placement_driver.h"

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../test_util.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/engine/param_store.h"
#include "tandem/models/block_sequence.h"
#include "tandem/monitor/sampler.h"

namespace tandem {
namespace {

/// The embedding, decoder layers of the given parameter counts, the head: Blocks 0 .. n + 1.
class SizedBlocks : public BlockSequence {
 public:
  explicit SizedBlocks(const std::vector<int64_t>& layer_sizes) {
    add("embed", BlockKind::kEmbedding, 24);
    for (size_t i = 0; i < layer_sizes.size(); ++i)
      add("layer." + std::to_string(i), BlockKind::kLayer, layer_sizes[i]);
    add("head", BlockKind::kHead, 24);
  }
  size_t block_count() const override { return names_.size(); }
  std::string block_name(size_t i) const override { return names_.at(i); }
  BlockKind block_kind(size_t i) const override { return kinds_.at(i); }
  std::vector<NamedTensor> block_parameters(size_t i) override { return {{names_.at(i) + ".weight", params_.at(i)}}; }
  void set_before_block(std::function<void(size_t)> fn) override { before_ = std::move(fn); }
  void set_host_blocks(std::vector<bool> host) override { host_blocks = std::move(host); }

  std::vector<bool> host_blocks;  ///< the engine's last call

 private:
  void add(const std::string& name, BlockKind kind, int64_t numel) {
    names_.push_back(name);
    kinds_.push_back(kind);
    params_.push_back(torch::randn({numel, 1}).requires_grad_(true));
  }
  std::vector<std::string> names_;
  std::vector<BlockKind> kinds_;
  std::vector<torch::Tensor> params_;
  std::function<void(size_t)> before_;
};

// layer.0 is the largest, layer.1 the smallest: the cheapest-first order is 2, 3, 1.
struct Rig {
  SizedBlocks blocks{{100, 10, 50}};
  ParamStore store{blocks, ParamStoreOptions{}, /*gpu_blocks=*/0};
  OffloadEngine engine{blocks, store, EngineOptions{}};
  std::vector<std::string> log;
  std::function<void(const std::string&)> logger() {
    return [this](const std::string& line) { log.push_back(line); };
  }
};

PlacementConfig policy(PlacementPolicyKind kind) {
  PlacementConfig c;
  c.policy = kind;
  return c;
}

std::vector<bool> flags(const std::string& letters) {
  std::vector<bool> out;
  for (const char c : letters) out.push_back(c == 'C');
  return out;
}

TelemetrySample reading(std::vector<std::optional<double>> gpu_w, std::optional<double> cpu_pct) {
  TelemetrySample s;
  for (const auto w : gpu_w) {
    GpuReading g;
    g.power_w = w;
    s.gpus.push_back(g);
  }
  s.host.cpu_pct = cpu_pct;
  return s;
}

TEST(PlacementMovable, EveryDecoderLayerUnlessTheConfigSaysOtherwise) {
  SizedBlocks blocks({8, 8, 8});
  PlacementConfig c = policy(PlacementPolicyKind::kStatic);
  EXPECT_EQ(placement_movable(c, blocks), flags("GCCCG"));
  c.movable = MovableBlocks::parse("3,1");
  EXPECT_EQ(placement_movable(c, blocks), flags("GCGCG"));
  c.movable = MovableBlocks::parse("none");
  EXPECT_EQ(placement_movable(c, blocks), flags("GGGGG"));
  c = policy(PlacementPolicyKind::kOff);
  c.movable = MovableBlocks::parse("1,2");
  EXPECT_EQ(placement_movable(c, blocks), flags("GGGGG")) << "no policy: nothing moves";
}

TEST(PlacementMovable, OnlyDecoderLayersWithinTheModelMayBeListed) {
  SizedBlocks blocks({8, 8, 8});
  PlacementConfig c = policy(PlacementPolicyKind::kThreshold);
  c.movable = MovableBlocks::parse("0");
  std::string err = test::error_of([&] { placement_movable(c, blocks); });
  EXPECT_NE(err.find("block 0 (embed) is not a decoder layer"), std::string::npos) << err;
  c.movable = MovableBlocks::parse("1,4");
  err = test::error_of([&] { placement_movable(c, blocks); });
  EXPECT_NE(err.find("block 4 (head) is not a decoder layer"), std::string::npos) << err;
  c.movable = MovableBlocks::parse("5");
  err = test::error_of([&] { placement_movable(c, blocks); });
  EXPECT_NE(err.find("5 is not a block index in 0 .. 4"), std::string::npos) << err;
  EXPECT_NE(err.find("decoder layers are 1 .. 3"), std::string::npos) << err;
}

TEST(PlacementDriver, AStaticPlacementIsAppliedOnceAndReported) {
  Rig r;
  PlacementConfig c = policy(PlacementPolicyKind::kStatic);
  c.blocks = StaticBlocks::parse("GCGCG");
  PlacementDriver d(c, r.blocks, r.engine, r.logger());
  d.before_step(1, nullptr);
  EXPECT_EQ(r.engine.placement(), flags("GCGCG"));
  EXPECT_EQ(r.blocks.host_blocks, flags("GCGCG")) << "the engine tells the model where its Blocks run";
  ASSERT_EQ(r.log.size(), 1u);
  EXPECT_EQ(r.log[0], "placement at step 1: GCGCG (static)");
  nlohmann::json row;
  d.after_step(0.5, 30.0, std::nullopt, row);
  EXPECT_EQ(row.value("placement", ""), "GCGCG");
  EXPECT_EQ(row.value("placement_policy", ""), "static");
  EXPECT_EQ(row.value("placement_cpu_blocks", -1), 2);
  EXPECT_EQ(row.value("placement_pace_s", -1.0), 0.0);
  EXPECT_DOUBLE_EQ(row.value("placement_gpu_power_w", 0.0), 60.0) << "30 J over 0.5 s";
  EXPECT_TRUE(row.contains("placement_mirror_refreshes"));
  EXPECT_TRUE(row.contains("placement_max_mirror_lag"));
  EXPECT_FALSE(row.contains("placement_in_gpu_power_w")) << "no readings";
  EXPECT_FALSE(row.contains("placement_pred_step_s")) << "no cost model";
  d.before_step(2, nullptr);
  EXPECT_EQ(r.log.size(), 1u) << "the same placement again is no move";
  const nlohmann::json s = d.summary();
  EXPECT_EQ(s.value("policy", ""), "static");
  EXPECT_EQ(s.value("moves", -1), 1);
  EXPECT_EQ(s.value("final", ""), "GCGCG");
  EXPECT_EQ(s.value("mirror_every", -1), 1);
  EXPECT_FALSE(s.contains("costs"));
  EXPECT_FALSE(s.contains("gpu_power_budget_w"));
  nlohmann::json zero_time;
  d.after_step(0.0, 30.0, std::nullopt, zero_time);
  EXPECT_FALSE(zero_time.contains("placement_gpu_power_w")) << "no power from a step without time";
}

TEST(PlacementDriver, StaticCpuMeansEveryMovableBlock) {
  {
    Rig r;
    PlacementConfig c = policy(PlacementPolicyKind::kStatic);
    c.blocks = StaticBlocks::parse("cpu");
    PlacementDriver d(c, r.blocks, r.engine, {});
    d.before_step(1, nullptr);
    EXPECT_EQ(r.engine.placement(), flags("GCCCG")) << "the embedding and head stay";
  }
  {
    Rig r;
    PlacementConfig c = policy(PlacementPolicyKind::kStatic);
    c.blocks = StaticBlocks::parse("cpu");
    c.movable = MovableBlocks::parse("2");
    PlacementDriver d(c, r.blocks, r.engine, {});
    d.before_step(1, nullptr);
    EXPECT_EQ(r.engine.placement(), flags("GGCGG"));
    EXPECT_EQ(d.summary().value("final", ""), "GGCGG");
  }
}

TEST(PlacementDriver, StaticLettersMustCountTheBlocksAndMoveOnlyMovableOnes) {
  Rig r;
  PlacementConfig c = policy(PlacementPolicyKind::kStatic);
  c.blocks = StaticBlocks::parse("GGG");
  std::string err = test::error_of([&] { PlacementDriver d(c, r.blocks, r.engine, {}); });
  EXPECT_EQ(err.rfind("placement.blocks: ", 0), 0u) << err;
  EXPECT_NE(err.find("3 letters for 5 blocks"), std::string::npos) << err;
  c.blocks = StaticBlocks::parse("GGGGC");
  err = test::error_of([&] { PlacementDriver d(c, r.blocks, r.engine, {}); });
  EXPECT_NE(err.find("puts block 4 (head) on the CPU, but it is not movable"), std::string::npos) << err;
  c.blocks = StaticBlocks::parse("GGCGG");
  c.movable = MovableBlocks::parse("1");
  err = test::error_of([&] { PlacementDriver d(c, r.blocks, r.engine, {}); });
  EXPECT_NE(err.find("block 2 (layer.1)"), std::string::npos) << "listed as movable or not at all: " << err;
}

TEST(PlacementDriver, OffIsNoPolicyToDrive) {
  Rig r;
  const std::string err =
      test::error_of([&] { PlacementDriver d(policy(PlacementPolicyKind::kOff), r.blocks, r.engine, {}); });
  EXPECT_NE(err.find("placement.policy must be static, threshold or cost here; got 'off'"), std::string::npos) << err;
}

TEST(PlacementDriver, TheThresholdRuleSeesTheSummedGpuPowerAndMovesTheCheapestBlockFirst) {
  Rig r;
  PlacementConfig c = policy(PlacementPolicyKind::kThreshold);
  c.threshold_w = 100;
  c.threshold_cpu_pct = 80;
  c.release_w = 20;
  c.dwell_steps = 1;
  PlacementDriver d(c, r.blocks, r.engine, r.logger());
  // Two GPUs at 80 W and 70 W: 150 W over the threshold, though neither is alone.
  const TelemetrySample hot = reading({80.0, 70.0}, 10.0);
  d.before_step(1, &hot);
  EXPECT_EQ(r.engine.placement(), flags("GGCGG")) << "layer.1, the smallest, first";
  ASSERT_EQ(r.log.size(), 1u);
  EXPECT_EQ(r.log[0], "placement at step 1: GGCGG (threshold; GPU 150 W, CPU 10%)");
  nlohmann::json row;
  d.after_step(0.1, std::nullopt, std::nullopt, row);
  EXPECT_EQ(row.value("placement_in_gpu_power_w", 0.0), 150.0);
  EXPECT_EQ(row.value("placement_in_cpu_util_pct", 0.0), 10.0);
  EXPECT_EQ(row.value("placement_policy", ""), "threshold");
  EXPECT_FALSE(row.contains("placement_gpu_power_w")) << "no energy reading this step";
  d.before_step(2, &hot);
  EXPECT_EQ(r.engine.placement(), flags("GGCCG")) << "then layer.2 (50), before layer.0 (100)";
  // A GPU without a power reading adds nothing: 90 W is neither over 100 nor under 80.
  const TelemetrySample partial = reading({90.0, std::nullopt}, 10.0);
  d.before_step(3, &partial);
  EXPECT_EQ(r.engine.placement(), flags("GGCCG"));
  d.before_step(4, nullptr);
  EXPECT_EQ(r.engine.placement(), flags("GGCCG")) << "no readings: no move";
  const TelemetrySample cool = reading({70.0}, 10.0);
  d.before_step(5, &cool);
  EXPECT_EQ(r.engine.placement(), flags("GGCGG")) << "the last to leave comes back first";
  EXPECT_EQ(d.summary().value("moves", -1), 3);
  EXPECT_EQ(d.summary().value("policy", ""), "threshold");
}

TEST(PlacementDriver, TheCostModelProfilesEachKindOfBlockThenPacesTowardTheBudget) {
  Rig r;
  PlacementConfig c = policy(PlacementPolicyKind::kCost);
  c.profile_steps = 1;
  c.gpu_power_budget_w = 100;
  PlacementDriver d(c, r.blocks, r.engine, r.logger());
  // Note [Placement profiles]: 4 warm-up steps, the all-GPU probe, then one probe per Block size.
  const std::vector<std::string> phases = {"profile warm-up (all on the GPU)", "profile warm-up (all on the GPU)",
                                           "profile warm-up (all on the GPU)", "profile warm-up (all on the GPU)",
                                           "profile 1/4: all on the GPU",      "profile 2/4: block 1 on the CPU",
                                           "profile 3/4: block 2 on the CPU",  "profile 4/4: block 3 on the CPU"};
  const std::vector<std::string> placed = {"GGGGG", "GGGGG", "GGGGG", "GGGGG", "GGGGG", "GCGGG", "GGCGG", "GGGCG"};
  for (size_t i = 0; i < phases.size(); ++i) {
    const auto step = static_cast<int64_t>(i + 1);
    d.before_step(step, nullptr);
    EXPECT_EQ(r.engine.placement(), flags(placed[i])) << "step " << step;
    nlohmann::json row;
    d.after_step(0.1, std::nullopt, std::nullopt, row);  // no energy readings while profiling
    EXPECT_EQ(row.value("placement_policy", ""), phases[i]) << "step " << step;
    EXPECT_FALSE(row.contains("placement_pred_step_s")) << "step " << step;
  }
  ASSERT_FALSE(r.log.empty());
  EXPECT_EQ(r.log.back().rfind("placement cost model: GPU idle 70 W;", 0), 0u) << r.log.back();
  EXPECT_NE(r.log.back().find("predicted 100.0 ms per step"), std::string::npos) << r.log.back();

  // The Blocks measured no time of their own (no step ran), so the step's 0.1 s is the embedding's.
  nlohmann::json row;
  for (int64_t step = 9; step <= 13; ++step) {
    d.before_step(step, nullptr);
    EXPECT_EQ(d.pace_s(), 0.0) << "within the budget as predicted: no pacing yet";
    row = nlohmann::json::object();
    d.after_step(0.1, 20.0, std::nullopt, row);  // 200 W measured
    EXPECT_EQ(row.value("placement_policy", ""), "cost");
    EXPECT_DOUBLE_EQ(row.value("placement_gpu_power_w", 0.0), 200.0);
    EXPECT_EQ(row.value("placement_budget_w", 0.0), 100.0);
  }
  // After 5 steps the loop corrects the pacing by half the idle time that brings 200 W to the
  // budget at the 70 W idle power: 0.5 x 0.1 x (200 - 100) / (100 - 70).
  const double pace = 0.5 * 0.1 * 100 / 30;
  d.before_step(14, nullptr);
  EXPECT_NEAR(d.pace_s(), pace, 1e-12);
  row = nlohmann::json::object();
  d.after_step(0.1, 20.0, std::nullopt, row);
  EXPECT_NEAR(row.value("placement_pace_s", 0.0), pace, 1e-12);
  EXPECT_NEAR(row.value("placement_pred_step_s", 0.0), 0.1 + pace, 1e-12);
  EXPECT_NEAR(row.value("placement_pred_gpu_power_w", 0.0), 70 * pace / (0.1 + pace), 1e-9);

  const nlohmann::json s = d.summary();
  EXPECT_EQ(s.value("policy", ""), "cost");
  ASSERT_TRUE(s.contains("costs")) << s.dump();
  ASSERT_EQ(s["costs"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(s["costs"][i].value("movable", false), i >= 1 && i <= 3) << i;
  EXPECT_EQ(s["costs"][0].value("block", ""), "embed");
  EXPECT_DOUBLE_EQ(s["costs"][0].value("gpu_s", 0.0), 0.1);
  EXPECT_EQ(s.value("gpu_idle_w", 0.0), 70.0);
  EXPECT_NEAR(s.value("predicted_step_s", 0.0), 0.1 + pace, 1e-12);
  EXPECT_EQ(s.value("gpu_power_budget_w", 0.0), 100.0);
}

}  // namespace
}  // namespace tandem
