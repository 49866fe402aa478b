#include "tandem/sched/update_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../error_of.h"
#include "tandem/core/error.h"

// Expected times below are worked out by hand from Note [Update split]: backward in reverse Block
// order, then D2H -> CPU -> H2D per CPU-updated Block on three serial resources, then the forward
// waiting on each upload. Where a test demands exact equality the inputs are dyadic fractions, so
// every sum is exact in double whatever the order of addition.

namespace tandem {
namespace {

using test::error_of;

std::vector<BlockTiming> uniform_blocks(int n, int64_t params, double fwd_s, double bwd_s) {
  return std::vector<BlockTiming>(n, BlockTiming{params, fwd_s, bwd_s});
}

constexpr int64_t kRoomy = int64_t{1} << 50;

// Block 0: 4 params, fwd 1, bwd 2. Block 1: 4 params, fwd 1.5, bwd 3. Per block: D2H 1 s, CPU 2 s,
// H2D 1 s, GPU update 0.5 s.
std::vector<BlockTiming> two_blocks() { return {{4, 1.0, 2.0}, {4, 1.5, 3.0}}; }
SplitCosts two_block_costs() { return SplitCosts{0.5, 0.125, 0.25, 0.25, 12}; }

// 8 Blocks of 1000 params, fwd 0.5 s, bwd 1 s; per Block a CPU update of 4 s (four backward
// Blocks), a GPU update of 0.1 s, and transfers of 0.1 s each way.
SplitCosts slow_cpu_costs() { return SplitCosts{4e-3, 1e-4, 1e-4, 1e-4, 12}; }

TEST(UpdateSplit, AllOnGpuIsForwardPlusBackwardPlusGpuUpdates) {
  const std::vector<BlockTiming> blocks = {{3, 0.25, 0.5}, {5, 1.5, 2.75}, {2, 0.125, 0.375}};
  const SplitCosts costs{1.0, 0.0625, 0.5, 0.5, 12};  // CPU and transfer costs must not matter
  const StepPrediction p = predict_step(blocks, costs, 3);
  // fwd 0.25 + 1.5 + 0.125 = 1.875; bwd 0.5 + 2.75 + 0.375 = 3.625; GPU updates 10 x 0.0625 = 0.625.
  EXPECT_EQ(p.step_s, 1.875 + 3.625 + 0.625);
  EXPECT_EQ(p.compute_s, 6.125);
  EXPECT_EQ(p.gpu_update_s, 0.625);
  EXPECT_EQ(p.gpu_idle_s, 0.0);
  EXPECT_EQ(p.cpu_update_s, 0.0);
  EXPECT_EQ(p.last_upload_s, 0.0);
}

TEST(UpdateSplit, FreeTransfersAndCpuHideEverything) {
  const std::vector<BlockTiming> blocks = {{3, 0.25, 0.5}, {5, 1.5, 2.75}, {2, 0.125, 0.375}};
  const StepPrediction p = predict_step(blocks, SplitCosts{0, 1.0, 0, 0, 12}, 0);
  // Each upload lands when its backward ends, before the compute stream is free again.
  EXPECT_EQ(p.step_s, 1.875 + 3.625);
  EXPECT_EQ(p.gpu_idle_s, 0.0);
  EXPECT_EQ(p.last_upload_s, 3.625);
}

TEST(UpdateSplit, TwoBlocksExposeTheUploadWait) {
  const auto blocks = two_blocks();
  const SplitCosts costs = two_block_costs();

  // g = 0. Backward: block 1 [0, 3], block 0 [3, 5]. Block 1: D2H [3, 4], CPU [4, 6], H2D [6, 7].
  // Block 0: D2H [5, 6], CPU [6, 8], H2D [8, 9]. Forward: block 0 waits 5 -> 9, runs [9, 10];
  // block 1 (uploaded at 7) runs [10, 11.5].
  const StepPrediction cpu_only = predict_step(blocks, costs, 0);
  EXPECT_EQ(cpu_only.step_s, 11.5);
  EXPECT_EQ(cpu_only.gpu_idle_s, 4.0);
  EXPECT_EQ(cpu_only.last_upload_s, 9.0);
  EXPECT_EQ(cpu_only.cpu_update_s, 4.0);
  EXPECT_EQ(cpu_only.compute_s, 7.5);

  // g = 1. Block 1 as above, uploaded at 7. Block 0: backward [3, 5], GPU update [5, 5.5],
  // forward [5.5, 6.5]; block 1 waits 6.5 -> 7 and runs [7, 8.5].
  const StepPrediction one_gpu = predict_step(blocks, costs, 1);
  EXPECT_EQ(one_gpu.step_s, 8.5);
  EXPECT_EQ(one_gpu.gpu_idle_s, 0.5);
  EXPECT_EQ(one_gpu.last_upload_s, 7.0);
  EXPECT_EQ(one_gpu.gpu_update_s, 0.5);
  EXPECT_EQ(one_gpu.cpu_update_s, 2.0);

  // g = 2: 3 + 0.5 + 2 + 0.5 + 1 + 1.5, no waits.
  const StepPrediction all_gpu = predict_step(blocks, costs, 2);
  EXPECT_EQ(all_gpu.step_s, 8.5);
  EXPECT_EQ(all_gpu.gpu_idle_s, 0.0);
}

TEST(UpdateSplit, D2hCpuAndH2dAreEachSerial) {
  // Only one stage costs anything: 4 s per Block. Block 1's stage runs [3, 7]; block 0's
  // backward ends at 5 but its stage must wait for block 1's: [7, 11]. Forward: block 0 waits
  // 5 -> 11, runs [11, 12]; block 1 runs [12, 13.5]. (A stage running both Blocks at once would
  // upload block 0 at 9: 11.5 s.)
  const SplitCosts only_d2h{0, 0.125, 1.0, 0, 12}, only_cpu{1.0, 0.125, 0, 0, 12}, only_h2d{0, 0.125, 0, 1.0, 12};
  for (const SplitCosts& costs : {only_d2h, only_cpu, only_h2d}) {
    const StepPrediction p = predict_step(two_blocks(), costs, 0);
    EXPECT_EQ(p.step_s, 13.5) << "d2h " << costs.d2h_s_per_param << ", cpu " << costs.cpu_update_s_per_param;
    EXPECT_EQ(p.gpu_idle_s, 6.0) << "d2h " << costs.d2h_s_per_param << ", cpu " << costs.cpu_update_s_per_param;
    EXPECT_EQ(p.last_upload_s, 11.0) << "d2h " << costs.d2h_s_per_param << ", cpu " << costs.cpu_update_s_per_param;
  }
}

TEST(UpdateSplit, TieGoesToFewerGpuBlocks) {
  // g = 1 and g = 2 both predict 8.5 s (see above); g = 1 keeps one Block's states off the GPU.
  const SplitDecision d = solve_update_split(two_blocks(), two_block_costs(), kRoomy, std::nullopt);
  EXPECT_EQ(d.gpu_blocks, 1);
  EXPECT_EQ(d.k, 0.5);
  EXPECT_EQ(d.alpha, 0.25);
  EXPECT_EQ(d.predicted_step_s, 8.5);
  EXPECT_EQ(d.predicted_by_gpu_blocks, (std::vector<double>{11.5, 8.5, 8.5}));
  EXPECT_EQ(d.gpu_resident_bytes, 4 * 12);
}

TEST(UpdateSplit, FastCpuKeepsEveryUpdateOnTheCpu) {
  const auto blocks = uniform_blocks(10, 1000, 0.5, 1.0);
  const SplitCosts costs{1e-9, 1e-6, 1e-9, 1e-9, 12};
  const SplitDecision d = solve_update_split(blocks, costs, kRoomy, std::nullopt);
  EXPECT_EQ(d.gpu_blocks, 0) << d.reason;
  EXPECT_EQ(d.k, 0.0);
  EXPECT_DOUBLE_EQ(d.alpha, 1000.0);
  EXPECT_EQ(d.gpu_resident_bytes, 0);
  // Only block 0's D2H + CPU + H2D (3 x 1 us) is exposed, after 10 s of backward, before 5 s of
  // forward; every GPU Block would add 1 ms to the compute stream.
  EXPECT_NEAR(d.predicted_step_s, 15.0 + 3e-6, 1e-12);
  ASSERT_EQ(d.predicted_by_gpu_blocks.size(), 11u);
  for (size_t g = 1; g < d.predicted_by_gpu_blocks.size(); ++g) {
    EXPECT_GT(d.predicted_by_gpu_blocks[g], d.predicted_step_s) << "g = " << g;
  }
  EXPECT_NE(d.reason.find("every update on the CPU"), std::string::npos) << d.reason;
}

TEST(UpdateSplit, SlowCpuMovesTheFrontBlocksToTheGpu) {
  const auto blocks = uniform_blocks(8, 1000, 0.5, 1.0);
  const SplitDecision d = solve_update_split(blocks, slow_cpu_costs(), kRoomy, std::nullopt);
  // g = 6: CPU Blocks 7 and 6. Block 7: D2H [1, 1.1], CPU [1.1, 5.1], H2D [5.1, 5.2]; block 6:
  // D2H [2, 2.1], CPU [5.1, 9.1], H2D [9.1, 9.2]. Backward + GPU updates end at 2 + 6 x 1.1 = 8.6,
  // the forward of blocks 0..5 at 11.6, after both uploads: 12.6 s, no wait.
  // g = 5 leaves CPU Block 5 uploaded at 13.2 while the forward reaches it at 8.5 + 2.5 = 11:
  // 14.7 s. g = 7 and g = 8 only add 0.1 s of GPU updates each.
  EXPECT_EQ(d.gpu_blocks, 6) << d.reason;
  EXPECT_EQ(d.k, 0.75);
  EXPECT_NEAR(d.predicted_step_s, 12.6, 1e-9);
  ASSERT_EQ(d.predicted_by_gpu_blocks.size(), 9u);
  EXPECT_NEAR(d.predicted_by_gpu_blocks[5], 14.7, 1e-9);
  EXPECT_NEAR(d.predicted_by_gpu_blocks[7], 12.7, 1e-9);
  EXPECT_NEAR(d.predicted_by_gpu_blocks[8], 12.8, 1e-9);
  // g = 0: the CPU chain of 8 x 4 s ends at 33.1, block 0's upload at 33.2, then 4 s of forward.
  EXPECT_NEAR(d.predicted_by_gpu_blocks[0], 37.2, 1e-9);
  EXPECT_LE(d.predicted_step_s, d.predicted_by_gpu_blocks[0]);
  EXPECT_EQ(d.predicted_step_s, *std::min_element(d.predicted_by_gpu_blocks.begin(), d.predicted_by_gpu_blocks.end()));
  EXPECT_EQ(d.gpu_resident_bytes, 6 * 1000 * 12);

  const StepPrediction p = predict_step(blocks, slow_cpu_costs(), 0);
  EXPECT_NEAR(p.gpu_idle_s, 33.2 - 8.0, 1e-9);
  EXPECT_NEAR(p.cpu_update_s, 32.0, 1e-9);
}

TEST(UpdateSplit, GpuBudgetLimitsTheGpuBlocks) {
  const auto blocks = uniform_blocks(8, 1000, 0.5, 1.0);
  const int64_t three_blocks = 3 * 1000 * 12;
  const SplitDecision d = solve_update_split(blocks, slow_cpu_costs(), three_blocks, std::nullopt);
  // g = 3: the CPU chain of blocks 7..3 ends at 1.1 + 20, block 3's upload at 21.2; the forward of
  // blocks 0..2 ends at 5 + 3 x 1.1 + 1.5 = 9.8, so 11.4 s of waiting, then 2.5 s of forward.
  EXPECT_EQ(d.gpu_blocks, 3) << d.reason;
  EXPECT_EQ(d.gpu_resident_bytes, three_blocks);
  EXPECT_EQ(d.predicted_by_gpu_blocks.size(), 4u);
  EXPECT_NEAR(d.predicted_step_s, 23.7, 1e-9);
  EXPECT_NE(d.reason.find("budget"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("binds"), std::string::npos) << d.reason;

  // The budget is inclusive: one byte less fits only two Blocks.
  const SplitDecision tighter = solve_update_split(blocks, slow_cpu_costs(), three_blocks - 1, std::nullopt);
  EXPECT_EQ(tighter.gpu_blocks, 2);
  EXPECT_EQ(tighter.predicted_by_gpu_blocks.size(), 3u);

  const SplitDecision none = solve_update_split(blocks, slow_cpu_costs(), 0, std::nullopt);
  EXPECT_EQ(none.gpu_blocks, 0);
  EXPECT_EQ(none.predicted_by_gpu_blocks.size(), 1u);

  // A Block without parameters (a tied head) costs no GPU memory.
  auto tied = blocks;
  tied[0].params = 0;
  EXPECT_EQ(solve_update_split(tied, slow_cpu_costs(), three_blocks, std::nullopt).predicted_by_gpu_blocks.size(), 5u);
}

TEST(UpdateSplit, FixedKRoundsAndIsClampedByTheBudget) {
  const auto blocks = uniform_blocks(8, 1000, 0.5, 1.0);
  const SplitCosts fast_cpu{1e-9, 1e-6, 1e-9, 1e-9, 12};  // auto would pick g = 0
  struct Case {
    double k;
    int64_t gpu_blocks;
  };
  // 0.3 x 8 = 2.4 -> 2; 0.3125 x 8 = 2.5 -> 3 (halves up); 0.9 x 8 = 7.2 -> 7.
  for (const Case& c : {Case{0.0, 0}, Case{0.3, 2}, Case{0.3125, 3}, Case{0.5, 4}, Case{0.9, 7}, Case{1.0, 8}}) {
    const SplitDecision d = solve_update_split(blocks, fast_cpu, kRoomy, c.k);
    EXPECT_EQ(d.gpu_blocks, c.gpu_blocks) << "k = " << c.k;
    EXPECT_EQ(d.k, static_cast<double>(c.gpu_blocks) / 8) << "k = " << c.k;
    EXPECT_EQ(d.predicted_step_s, predict_step(blocks, fast_cpu, c.gpu_blocks).step_s) << "k = " << c.k;
    EXPECT_EQ(d.reason.find("clamped"), std::string::npos) << d.reason;
  }

  const int64_t three_blocks = 3 * 1000 * 12;
  const SplitDecision clamped = solve_update_split(blocks, fast_cpu, three_blocks, 0.75);
  EXPECT_EQ(clamped.gpu_blocks, 3);
  EXPECT_EQ(clamped.k, 0.375);
  EXPECT_EQ(clamped.gpu_resident_bytes, three_blocks);
  EXPECT_NE(clamped.reason.find("clamped"), std::string::npos) << clamped.reason;
  EXPECT_EQ(clamped.predicted_step_s, predict_step(blocks, fast_cpu, 3).step_s);

  const SplitDecision fits = solve_update_split(blocks, fast_cpu, three_blocks, 0.375);
  EXPECT_EQ(fits.gpu_blocks, 3);
  EXPECT_EQ(fits.reason.find("clamped"), std::string::npos) << fits.reason;
}

TEST(UpdateSplit, StepIsComputePlusWaitsAndGrowsWithCpuCost) {
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> time(0.0, 2.0);
  std::uniform_int_distribution<int64_t> params(0, 5000);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<BlockTiming> blocks(1 + trial % 17);
    for (auto& b : blocks) b = {params(rng), time(rng), time(rng)};
    const SplitCosts costs{time(rng) * 1e-3, time(rng) * 1e-4, time(rng) * 1e-4, time(rng) * 1e-4, 12};
    SplitCosts slower = costs;
    slower.cpu_update_s_per_param *= 1.5;
    for (int64_t g = 0; g <= static_cast<int64_t>(blocks.size()); ++g) {
      const StepPrediction p = predict_step(blocks, costs, g);
      EXPECT_NEAR(p.step_s, p.compute_s + p.gpu_idle_s, 1e-9 * p.step_s) << "trial " << trial << ", g " << g;
      EXPECT_GE(p.gpu_idle_s, 0.0);
      EXPECT_GE(p.step_s, p.last_upload_s) << "the forward must wait for every upload";
      EXPECT_GE(predict_step(blocks, slower, g).step_s, p.step_s) << "trial " << trial << ", g " << g;
    }
    const SplitDecision d = solve_update_split(blocks, costs, kRoomy, std::nullopt);
    const auto& by_g = d.predicted_by_gpu_blocks;
    EXPECT_LE(d.predicted_step_s, *std::min_element(by_g.begin(), by_g.end()) * (1 + 1e-9)) << d.reason;
  }
}

TEST(UpdateSplit, BadInputsAreUserErrors) {
  const auto blocks = two_blocks();
  const SplitCosts costs = two_block_costs();
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    const std::string msg = error_of(f);
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: '" << msg << "', expected to name '" << needle << "'";
  };

  expect_error([&] { predict_step({}, costs, 0); }, "no blocks");
  expect_error([&] { solve_update_split({}, costs, kRoomy, std::nullopt); }, "no blocks");

  auto bad = blocks;
  bad[1].fwd_s = -1;
  expect_error([&] { predict_step(bad, costs, 0); }, "block 1 has fwd_s = -1");
  bad = blocks;
  bad[0].bwd_s = std::numeric_limits<double>::quiet_NaN();
  expect_error([&] { solve_update_split(bad, costs, kRoomy, std::nullopt); }, "block 0 has bwd_s");
  bad = blocks;
  bad[0].params = -4;
  expect_error([&] { predict_step(bad, costs, 0); }, "params = -4");

  SplitCosts c = costs;
  c.d2h_s_per_param = -0.5;
  expect_error([&] { predict_step(blocks, c, 0); }, "d2h_s_per_param");
  c = costs;
  c.h2d_s_per_param = std::numeric_limits<double>::infinity();
  expect_error([&] { predict_step(blocks, c, 0); }, "h2d_s_per_param");
  c = costs;
  c.gpu_update_s_per_param = -1;
  expect_error([&] { predict_step(blocks, c, 0); }, "gpu_update_s_per_param");
  c = costs;
  c.gpu_bytes_per_param_resident = -12;
  expect_error([&] { solve_update_split(blocks, c, kRoomy, std::nullopt); }, "gpu_bytes_per_param_resident");
  c = costs;
  c.cpu_update_s_per_param = 0;
  expect_error([&] { solve_update_split(blocks, c, kRoomy, std::nullopt); }, "cpu_update_s_per_param");

  expect_error([&] { predict_step(blocks, costs, 3); }, "gpu_blocks = 3");
  expect_error([&] { predict_step(blocks, costs, -1); }, "gpu_blocks = -1");
  expect_error([&] { solve_update_split(blocks, costs, -1, std::nullopt); }, "gpu_bytes_budget");
  expect_error([&] { solve_update_split(blocks, costs, kRoomy, 1.5); }, "fixed k = 1.5");
  expect_error([&] { solve_update_split(blocks, costs, kRoomy, -0.1); }, "fixed k");
  expect_error([&] { solve_update_split(blocks, costs, kRoomy, std::numeric_limits<double>::quiet_NaN()); }, "fixed k");
}

TEST(UpdateSplit, WaitingForTheNormAndDelayedUpdatesAreModelled) {
  // two_blocks, every update on the CPU. As gradients arrive: Block 1's update [4, 6], upload
  // [6, 7]; Block 0's [6, 8], upload [8, 9]; the forward waits to 9: 9 + 1 + 1.5 = 11.5.
  SplitCosts c = two_block_costs();
  EXPECT_EQ(predict_step(two_blocks(), c, 0).step_s, 11.5);
  // After the backward (t = 5), in forward order: Block 0 [6, 8] (its gradient lands at 6), upload
  // [8, 9]; Block 1 [8, 10], upload [10, 11]; forward: Block 0 at 9 .. 10, Block 1 waits to 11:
  // 12.5, of which 4 + 1 waiting.
  c.cpu_start = SplitCosts::CpuStart::kAfterBackward;
  const auto after = predict_step(two_blocks(), c, 0);
  EXPECT_EQ(after.step_s, 12.5);
  EXPECT_EQ(after.gpu_idle_s, 5.0);
  // Delayed: nobody waits; compute (5 + 2.5) is the busiest resource (CPU 4, D2H ends at 6).
  c.cpu_start = SplitCosts::CpuStart::kDelayed;
  const auto delayed = predict_step(two_blocks(), c, 0);
  EXPECT_EQ(delayed.step_s, 7.5);
  EXPECT_EQ(delayed.gpu_idle_s, 0.0);
  // ... until the CPU is: 4 s per Block makes it 8 s.
  c.cpu_update_s_per_param = 1.0;
  EXPECT_EQ(predict_step(two_blocks(), c, 0).step_s, 8.0);
}

TEST(UpdateSplit, AFloorRaisesTheChoiceToTheFastestSplitAboveIt) {
  // With a fast CPU every update stays on the CPU; a floor of 2 takes the fastest of 2..8 instead,
  // and a fixed k below the floor is raised to it. The floor never exceeds what fits.
  const auto blocks = uniform_blocks(8, 1000, 0.5, 1.0);
  const SplitCosts fast_cpu{1e-5, 1e-4, 1e-5, 1e-5, 12};
  EXPECT_EQ(solve_update_split(blocks, fast_cpu, kRoomy).gpu_blocks, 0);
  const SplitDecision d = solve_update_split(blocks, fast_cpu, kRoomy, std::nullopt, 2);
  EXPECT_GE(d.gpu_blocks, 2);
  for (int64_t g = 2; g <= 8; ++g) EXPECT_LE(d.predicted_step_s, d.predicted_by_gpu_blocks[g] * (1 + 1e-9));
  EXPECT_EQ(solve_update_split(blocks, fast_cpu, kRoomy, 0.0, 3).gpu_blocks, 3);
  EXPECT_EQ(solve_update_split(blocks, fast_cpu, 12 * 1000 * 2, std::nullopt, 5).gpu_blocks, 2);
}

}  // namespace
}  // namespace tandem
