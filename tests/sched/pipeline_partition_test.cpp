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
