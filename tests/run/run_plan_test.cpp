// Note [Run plan]: what a run decides before building, on one process (the ranks' agreement runs
// in tests/parallel).
#include "tandem/run/run_plan.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "tandem/run/run_setup.h"

namespace tandem {
namespace {

TEST(RunPlan, ResolvesTheArchitectureSequenceAndRunDirectoryWithoutWriting) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.file("run"), 3);
  c.train.seq_len = 0;
  const RunContext ctx = open_run_context(c);
  const RunPlan plan = resolve_run_plan(c, {}, ctx);
  EXPECT_EQ(plan.spec.name, "tiny");
  EXPECT_EQ(plan.seq_len, std::min<int64_t>(plan.spec.max_seq_len, 2048)) << "0 = the model's, at most 2048";
  EXPECT_EQ(plan.run_dir, dir.file("run"));
  EXPECT_EQ(plan.checkpoint_dir(), dir.file("run") + "/checkpoints");
  EXPECT_FALSE(plan.offload);
  EXPECT_TRUE(plan.resume_dir.empty());
  EXPECT_FALSE(std::filesystem::exists(dir.file("run"))) << "the plan creates nothing";
  EXPECT_EQ(config_hash(plan.cfg), config_hash(c)) << "one process: the config runs as given";
}

TEST(RunPlan, TheOffloadPlanResolvesTheHostRingOnTheCpu) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 3);
  c.offload.optimizer = OffloadTarget::kCpu;
  ASSERT_EQ(c.offload.host_ring, -1) << "auto by default";
  const RunPlan plan = resolve_run_plan(c, {}, open_run_context(c));
  EXPECT_TRUE(plan.offload);
  EXPECT_EQ(plan.cfg.offload.host_ring, 0) << "per-block buffers fit: no ring";
  EXPECT_EQ(plan.split_range.first, 0);
  EXPECT_EQ(plan.split_range.second, plan.spec.n_layer + 1) << "the CPU as the device: every prefix fits";
}

TEST(RunPlan, RefusesWhatNoStepCouldRun) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 3);
  const RunContext ctx = open_run_context(c);
  Config zero = c;
  zero.dist.zero_stage = 2;
  EXPECT_NE(test::error_of([&] { resolve_run_plan(zero, {}, ctx); }).find("set offload.optimizer=cpu"),
            std::string::npos);
  Config lion = c;
  lion.offload.optimizer = OffloadTarget::kCpu;
  lion.optim.type = OptimizerType::kLion;
  EXPECT_NE(test::error_of([&] { resolve_run_plan(lion, {}, ctx); }).find("use offload.optimizer=none"),
            std::string::npos);
  Config longer = c;
  longer.train.seq_len = 1 << 20;
  EXPECT_NE(test::error_of([&] { resolve_run_plan(longer, {}, ctx); }).find("exceeds model.max_seq_len"),
            std::string::npos);
  Config huge = c;
  huge.model.preset = "13B";
  huge.offload.host_memory_gib = 8;
  EXPECT_NE(test::error_of([&] { resolve_run_plan(huge, {}, ctx); }).find("8.00 GiB is available"), std::string::npos);
  EXPECT_NE(test::error_of([&] { resolve_run_plan(c, {dir.file("nothing")}, ctx); }).find("not a directory"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
