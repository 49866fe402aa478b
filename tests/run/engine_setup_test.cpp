// The offload engine from a run plan: its options from the config and its pieces over a model.
#include "tandem/run/engine_setup.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "tandem/engine/param_store.h"
#include "tandem/models/model.h"
#include "tandem/run/placement_driver.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"

namespace tandem {
namespace {

Config offload_config(const std::string& dir) {
  Config c = test::tiny_cpu_config(dir, 2);
  c.offload.optimizer = OffloadTarget::kCpu;
  return c;
}

TEST(EngineSetup, OptionsFollowTheConfig) {
  test::TempDir dir;
  Config c = offload_config(dir.path());
  c.optim.type = OptimizerType::kAdam;
  c.optim.beta2 = 0.95;
  c.optim.state_rounding = StateRounding::kStochastic;
  c.offload.speculate = Speculation::kAlways;
  c.offload.update_split = "0.5";
  c.offload.trace_steps = "2";
  const RunContext ctx = open_run_context(c);
  const RunPlan plan = resolve_run_plan(c, {}, ctx);
  const EngineOptions eo = engine_options(plan, ctx, {});
  EXPECT_FALSE(eo.adam.decoupled) << "adam: L2, not decoupled decay";
  EXPECT_DOUBLE_EQ(eo.adam.beta2, 0.95);
  EXPECT_EQ(eo.state_rounding, Rounding::kStochastic);
  EXPECT_EQ(eo.speculate, EngineOptions::Speculate::kAlways);
  ASSERT_TRUE(eo.fixed_k.has_value());
  EXPECT_DOUBLE_EQ(*eo.fixed_k, 0.5);
  EXPECT_EQ(eo.trace_steps, std::vector<int64_t>{2});
  EXPECT_EQ(eo.trace_path, dir.file("trace.json"));
  EXPECT_EQ(eo.min_gpu_blocks, plan.split_range.first);
  EXPECT_EQ(eo.max_gpu_blocks, plan.split_range.second);
  EXPECT_EQ(plan.gpu_blocks, 3) << "k = 0.5 of 4 layers: the embedding and 2 layers";
}

TEST(EngineSetup, BuildsTheStoreAndEngineOverTheModel) {
  test::TempDir dir;
  Config c = offload_config(dir.path());
  c.offload.update_split = "0.25";
  const RunContext ctx = open_run_context(c);
  const RunPlan plan = resolve_run_plan(c, {}, ctx);
  auto model = build_model(plan.spec, false);
  const OffloadParts parts = build_offload(*model, plan, ctx, {}, 0.0);
  ASSERT_NE(parts.store, nullptr);
  ASSERT_NE(parts.engine, nullptr);
  EXPECT_EQ(parts.placement, nullptr) << "placement.policy=off";
  EXPECT_EQ(parts.store->gpu_blocks(), 2) << "the embedding and layer 0";
}

TEST(EngineSetup, PlacementKeepsItsMovableBlocksCpuUpdated) {
  test::TempDir dir;
  Config c = offload_config(dir.path());
  c.placement.policy = PlacementPolicyKind::kStatic;
  c.placement.blocks = StaticBlocks::parse("GGCCGG");
  c.offload.update_split = "1";
  const RunContext ctx = open_run_context(c);
  const RunPlan plan = resolve_run_plan(c, {}, ctx);
  auto model = build_model(plan.spec, false);
  const OffloadParts parts = build_offload(*model, plan, ctx, {}, 0.0);
  ASSERT_NE(parts.placement, nullptr);
  EXPECT_EQ(parts.store->gpu_blocks(), 1) << "every decoder layer may move: only the embedding is device-updated";
}

}  // namespace
}  // namespace tandem
