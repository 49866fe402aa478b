// Note [Pipeline partition]: the partitioner against brute force on random Block costs and device
// speeds and memories, the bubble formula, heterogeneous memory, and the refusal.
#include "tandem/sched/pipeline_partition.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "../error_of.h"

namespace tandem {
namespace {

std::vector<PipelineBlockCost> equal_blocks(int n, double t = 0.01, int64_t bytes = 100) {
  std::vector<PipelineBlockCost> out;
  for (int i = 0; i < n; ++i) out.push_back({"layer" + std::to_string(i), t, bytes, bytes, 0});
  return out;
}

// Every cut into p stages, the fastest that fits; nullopt when none does.
std::optional<PipelinePlan> brute_force(const std::vector<PipelineBlockCost>& blocks,
                                        const std::vector<PipelineDevice>& devices, const PartitionOptions& o) {
  const int64_t n = static_cast<int64_t>(blocks.size()), p = static_cast<int64_t>(devices.size());
  std::optional<PipelinePlan> best;
  std::vector<int64_t> ends(p);
  std::function<void(int64_t, int64_t)> go = [&](int64_t s, int64_t a) {
    if (s == p - 1) {
      ends[s] = n;
      const auto plan = evaluate_pipeline(blocks, devices, ends, o);
      if (fits(plan) && (!best || plan.step_s < best->step_s)) best = plan;
      return;
    }
    for (int64_t b = a + 1; b <= n - (p - s - 1); ++b) {
      ends[s] = b;
      go(s + 1, b);
    }
  };
  go(0, 0);
  return best;
}

TEST(PipelinePartition, EqualsBruteForceOnRandomCostsSpeedsAndMemories) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> time(0.001, 0.02), speed(0.3, 2.0);
  std::uniform_int_distribution<int64_t> bytes(10, 1000), out(0, 5000);
  int solved = 0, refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9), p = 1 + static_cast<int>(rng() % std::min(4, n));
    std::vector<PipelineBlockCost> blocks;
    for (int i = 0; i < n; ++i)
      blocks.push_back({"b" + std::to_string(i), time(rng), bytes(rng), bytes(rng), out(rng)});
    std::vector<PipelineDevice> devices;
    for (int s = 0; s < p; ++s) devices.push_back({"d" + std::to_string(s), speed(rng), bytes(rng) * n / p * 6});
    PartitionOptions o;
    o.micro_batches = 1 + static_cast<int64_t>(rng() % 8);
    o.schedule = rng() % 2 ? PipelineSchedule::k1F1B : PipelineSchedule::kGPipe;
    o.link_bytes_per_s = 1e6;
    const auto want = brute_force(blocks, devices, o);
    if (!want) {
      EXPECT_NE(test::error_of([&] { partition_pipeline(blocks, devices, o); }).find("no cut of the"),
                std::string::npos);
      ++refused;
      continue;
    }
    const auto got = partition_pipeline(blocks, devices, o);
    EXPECT_TRUE(fits(got)) << "trial " << trial;
    EXPECT_NEAR(got.step_s, want->step_s, 1e-12 * want->step_s) << "trial " << trial << ", n " << n << ", p " << p;
    ++solved;
  }
  EXPECT_GT(solved, 100);
  EXPECT_GT(refused, 10) << "the memories must bind in some trials";
}

TEST(PipelinePartition, EqualStagesHaveTheOneF1BBubble) {
  for (const int64_t p : {2, 4})
    for (const int64_t m : {1, 4, 8}) {
      PartitionOptions o;
      o.micro_batches = m;
      const std::vector<PipelineDevice> devices(p, PipelineDevice{"gpu", 1.0, int64_t(1) << 40});
      const auto plan = partition_pipeline(equal_blocks(8), devices, o);
      for (const auto& s : plan.stages) EXPECT_EQ(s.end - s.first, 8 / p);
      EXPECT_NEAR(plan.bubble_fraction, double(p - 1) / double(m + p - 1), 1e-12);
      EXPECT_NEAR(plan.step_s, double(m + p - 1) * 0.01 * 8 / p, 1e-12);
    }
}

TEST(PipelinePartition, AFasterDeviceTakesMoreBlocksAndASmallerOneFewer) {
  PartitionOptions o;
  const auto blocks = equal_blocks(12);
  auto plan = partition_pipeline(blocks, {{"fast", 2.0, int64_t(1) << 40}, {"slow", 1.0, int64_t(1) << 40}}, o);
  EXPECT_EQ(plan.stages[0].end, 8);  // 8 / 2.0 = 4 / 1.0
  // Half the memory on the first GPU (a cap): 1F1B keeps 2 micro-batches of activations there.
  const int64_t per_block = 100 + 100 * 2;
  plan = partition_pipeline(blocks, {{"half", 1.0, 4 * per_block}, {"full", 1.0, int64_t(1) << 40}}, o);
  EXPECT_EQ(plan.stages[0].end, 4);
  EXPECT_TRUE(fits(plan));
}

TEST(PipelinePartition, GPipeKeepsEveryMicroBatchOneF1BFewer) {
  PartitionOptions o;
  o.micro_batches = 8;
  const std::vector<PipelineDevice> devices(2, PipelineDevice{"gpu", 1.0, int64_t(1) << 40});
  const std::vector<int64_t> ends = {4, 8};
  o.schedule = PipelineSchedule::kGPipe;
  EXPECT_EQ(evaluate_pipeline(equal_blocks(8), devices, ends, o).stages[0].memory_bytes, 4 * (100 + 100 * 8));
  o.schedule = PipelineSchedule::k1F1B;
  EXPECT_EQ(evaluate_pipeline(equal_blocks(8), devices, ends, o).stages[0].memory_bytes, 4 * (100 + 100 * 2));
  EXPECT_EQ(evaluate_pipeline(equal_blocks(8), devices, ends, o).stages[1].memory_bytes, 4 * (100 + 100 * 1));
}

TEST(PipelinePartition, ChoosesTheStageCountAndRefusesWhatCannotFit) {
  PartitionOptions o;
  o.micro_batches = 4;
  o.link_bytes_per_s = 1e3;
  auto blocks = equal_blocks(4, 0.01);
  for (auto& b : blocks) b.output_bytes = 100;  // 0.2 s per boundary: one stage is fastest
  const std::vector<PipelineDevice> devices(4, PipelineDevice{"gpu", 1.0, int64_t(1) << 40});
  EXPECT_EQ(choose_pipeline(blocks, devices, {1, 2, 4}, o).stages.size(), 1u);
  for (auto& b : blocks) b.output_bytes = 0;
  EXPECT_EQ(choose_pipeline(blocks, devices, {1, 2, 4}, o).stages.size(), 4u);
  const std::vector<PipelineDevice> tiny(2, PipelineDevice{"gpu", 1.0, 250});
  const auto msg = test::error_of([&] { partition_pipeline(blocks, tiny, o); });
  EXPECT_NE(msg.find("no cut of the 4 Blocks into 2 pipeline stages fits"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use more stages"), std::string::npos) << msg;
  EXPECT_NE(test::error_of([&] {
              partition_pipeline(blocks, std::vector<PipelineDevice>(5, devices[0]), o);
            }).find("at most 4 stages"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Note [Pipeline stage count]
TEST(PipelinePartition, AStageRunsAtItsSlowestAndSmallestReplica) {
  const std::vector<PipelineDevice> ranks = {{"a", 2.0, 100}, {"b", 1.0, 200}, {"c", 1.5, 50}, {"d", 1.5, 300}};
  const auto two = stage_devices(ranks, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].name, "b");
  EXPECT_DOUBLE_EQ(two[0].speed, 1.0);
  EXPECT_EQ(two[0].memory_bytes, 100);
  EXPECT_DOUBLE_EQ(two[1].speed, 1.5);
  EXPECT_EQ(two[1].memory_bytes, 50);
  EXPECT_EQ(stage_devices(ranks, 4)[2].name, "c");
  EXPECT_NE(test::error_of([&] { stage_devices(ranks, 3); }).find("does not divide the 4 ranks"), std::string::npos);
}

TEST(PipelinePartition, StageCountsFollowTheConfiguredCount) {
  EXPECT_EQ(pipeline_stage_counts(0, 8, 100, false), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(pipeline_stage_counts(0, 6, 4, false), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(pipeline_stage_counts(0, 8, 100, true), (std::vector<int64_t>{1}));
  EXPECT_EQ(pipeline_stage_counts(2, 4, 6, false), (std::vector<int64_t>{2}));
  EXPECT_NE(test::error_of([] { pipeline_stage_counts(2, 4, 6, true); }).find("model.tie_embeddings=false"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { pipeline_stage_counts(3, 4, 6, false); }).find("does not divide the 4 ranks"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { pipeline_stage_counts(7, 7, 6, false); }).find("use at most 6 stages"),
            std::string::npos);
}

TEST(PipelinePartition, ReplicasWinOnEqualDevicesAndStagesOnUnequalOnesOrWhenMemoryBinds) {
  PartitionOptions o;
  o.micro_batches = 8;
  const auto blocks = equal_blocks(10);
  const int64_t lots = int64_t(1) << 40;
  // Equal devices: 2 replicas of the whole model train 16 micro-batches in 8 t, a 2-stage
  // pipeline 8 in 4.5 t.
  auto plan = plan_over_ranks(blocks, {{"g0", 1.0, lots}, {"g1", 1.0, lots}}, {1, 2}, o);
  EXPECT_EQ(plan.stages.size(), 1u);
  EXPECT_EQ(plan.replicas, 2);
  // One device 4x faster: replicas run at the slower one's pace, a pipeline gives it 8 of 10 Blocks.
  plan = plan_over_ranks(blocks, {{"fast", 4.0, lots}, {"slow", 1.0, lots}}, {1, 2}, o);
  ASSERT_EQ(plan.stages.size(), 2u);
  EXPECT_EQ(plan.replicas, 1);
  EXPECT_EQ(plan.stages[0].end, 8);
  // The whole model does not fit one device: 10 x (100 + 100) bytes under 1F1B on one stage.
  plan = plan_over_ranks(blocks, {{"g0", 1.0, 1500}, {"g1", 1.0, 1500}}, {1, 2}, o);
  EXPECT_EQ(plan.stages.size(), 2u);
  EXPECT_TRUE(fits(plan));
  const auto msg = test::error_of([&] { plan_over_ranks(blocks, {{"g0", 1.0, 100}, {"g1", 1.0, 100}}, {1, 2}, o); });
  EXPECT_NE(msg.find("no cut of the 10 Blocks into 2 pipeline stages fits"), std::string::npos) << msg;
}

TEST(PipelinePartition, SpeedsAreRelativeToTheFirstDevice) {
  Config cfg;
  cfg.dist.pipeline_stages = "2";
  cfg.train.grad_accum = 4;
  const auto blocks = equal_blocks(12);
  const int64_t lots = int64_t(1) << 40;
  const auto absolute = plan_pipeline_costs(blocks, cfg, {{"a", 200.0, lots}, {"b", 100.0, lots}}, false);
  const auto relative = plan_pipeline_costs(blocks, cfg, {{"a", 1.0, lots}, {"b", 0.5, lots}}, false);
  EXPECT_EQ(stage_ends(absolute), (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(stage_ends(relative), stage_ends(absolute));
  EXPECT_DOUBLE_EQ(absolute.step_s, relative.step_s);
  EXPECT_DOUBLE_EQ(absolute.step_s, (4 - 1) * 0.08 + 0.16);
}

// Note [CPU pipeline stage]: one GPU of speed 1 and the host's cores on six Blocks of 10 ms.
struct CpuStageCase {
  std::vector<PipelineBlockCost> blocks = equal_blocks(6);
  PipelineDevice gpu{"cuda:0", 1.0, int64_t(1) << 40};
  PipelineDevice cpu{"cpu", 0.5, int64_t(1) << 40};
  PartitionOptions o;
  CpuStageCase() { o.micro_batches = 8; }
  CpuStageAnalysis run(double budget_w = 0) const { return analyse_cpu_stage(blocks, {gpu}, cpu, o, budget_w); }
};

TEST(PipelinePartition, TheCpuTakesTheShareItComputesWhileTheGpuWorks) {
  const auto a = CpuStageCase().run();
  ASSERT_TRUE(a.gpus_alone && a.with_cpu) << a.verdict;
  EXPECT_TRUE(a.helps) << a.verdict;
  EXPECT_NEAR(a.gpus_alone->step_s, 8 * 0.06, 1e-12);
  // Two Blocks at half speed take as long as the GPU's four: 7 x 40 ms + 80 ms.
  const auto& cpu = a.with_cpu->stages[static_cast<size_t>(a.cpu_stage)];
  EXPECT_EQ(cpu.end - cpu.first, 2);
  EXPECT_NEAR(a.with_cpu->step_s, 0.36, 1e-12);
  EXPECT_NE(a.verdict.find("the host CPU helps"), std::string::npos) << a.verdict;
  EXPECT_NE(a.verdict.find("step 360.0 ms against 480.0 ms"), std::string::npos) << a.verdict;
}

TEST(PipelinePartition, ATooSlowCpuIsLeftOutWithItsNumbers) {
  CpuStageCase c;
  c.cpu.speed = 0.05;  // one Block takes 200 ms there, the GPU's other five 50 ms
  const auto a = c.run();
  EXPECT_FALSE(a.helps);
  EXPECT_NE(a.verdict.find("too slow to help"), std::string::npos) << a.verdict;
  EXPECT_NE(a.verdict.find("200.00 ms per micro-batch on the CPU against 50.00 ms for the GPU stage's"),
            std::string::npos)
      << a.verdict;
  EXPECT_NE(a.verdict.find("step 1650.0 ms against 480.0 ms"), std::string::npos) << a.verdict;
}

TEST(PipelinePartition, TheCpuMeetsAGpuPowerBudgetThatTheGpuAloneExceeds) {
  CpuStageCase c;
  c.cpu.speed = 0.05;
  c.gpu.busy_w = 300;  // busy the whole step alone: 300 W
  auto a = c.run(250);
  ASSERT_TRUE(a.gpus_alone_w && a.with_cpu_w);
  EXPECT_NEAR(*a.gpus_alone_w, 300, 1e-9);
  EXPECT_TRUE(a.helps) << a.verdict;
  EXPECT_LE(*a.with_cpu_w, 250);
  EXPECT_GT(a.with_cpu->step_s, a.gpus_alone->step_s);
  EXPECT_NE(a.verdict.find("within placement.gpu_power_budget_w=250 W (300 W alone)"), std::string::npos) << a.verdict;
  // Of the plans within the budget it is the fastest: every share of either end, brute force.
  double best = 1e300;
  for (const bool first : {true, false})
    for (int64_t k = 1; k < 6; ++k) {
      const std::vector<PipelineDevice> devices =
          first ? std::vector<PipelineDevice>{c.cpu, c.gpu} : std::vector<PipelineDevice>{c.gpu, c.cpu};
      const auto p = evaluate_pipeline(c.blocks, devices, {first ? k : 6 - k, 6}, c.o);
      const double busy = 8 * p.stages[first ? 1 : 0].time_s / p.step_s;
      if (70 + 230 * busy <= 250) best = std::min(best, p.step_s);
    }
  EXPECT_NEAR(a.with_cpu->step_s, best, 1e-12);
  a = c.run(60);  // below the GPU's idle power
  EXPECT_FALSE(a.helps);
  EXPECT_NE(a.verdict.find("cannot bring the GPUs within"), std::string::npos) << a.verdict;
  a = c.run(400);  // the GPU alone is within it: the step decides
  EXPECT_FALSE(a.helps) << a.verdict;
}

TEST(PipelinePartition, TheCpuHoldsWhatTheGpuCannotAndNothingBeyondItsMemory) {
  CpuStageCase c;
  c.gpu.memory_bytes = 4 * (100 + 100);  // four Blocks with one micro-batch each in flight
  c.cpu.speed = 0.05;
  auto a = c.run();
  EXPECT_FALSE(a.gpus_alone.has_value());
  EXPECT_TRUE(a.helps) << a.verdict;
  EXPECT_NE(a.verdict.find("cannot hold the model"), std::string::npos) << a.verdict;
  EXPECT_TRUE(fits(*a.with_cpu));
  c.cpu.memory_bytes = 150;
  a = c.run();
  EXPECT_FALSE(a.helps);
  EXPECT_NE(a.verdict.find("cannot take a stage"), std::string::npos) << a.verdict;
}

}  // namespace
}  // namespace tandem
