// Note [Pipeline schedules]: each stage runs every micro-batch's forward and backward once, a
// backward after its forward, 1F1B holding at most p - s activations, GPipe all m; and the order
// of all stages together never deadlocks (simulated with blocking receives).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "tandem/sched/pipeline_schedule.h"

namespace tandem {
namespace {

using K = PipelinePass::Kind;

int64_t peak_in_flight(const std::vector<PipelinePass>& passes) {
  int64_t live = 0, peak = 0;
  for (const auto& p : passes) {
    live += p.kind == K::kForward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

// Every stage's passes run as processes with blocking receives: a forward needs the previous
// stage's forward of that micro-batch done, a backward the next stage's backward (the last stage's
// its own forward). Returns the number of passes completed before no stage can move.
size_t simulate(PipelineSchedule schedule, int64_t p, int64_t m) {
  std::vector<std::vector<PipelinePass>> order;
  for (int64_t s = 0; s < p; ++s) order.push_back(pipeline_passes(schedule, s, p, m));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::map<std::tuple<int64_t, int, int64_t>, bool> done;  // (stage, kind, micro)
  size_t completed = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (int64_t s = 0; s < p; ++s) {
      auto& i = next[static_cast<size_t>(s)];
      if (i == order[static_cast<size_t>(s)].size()) continue;
      const PipelinePass pass = order[static_cast<size_t>(s)][i];
      const bool fwd = pass.kind == K::kForward;
      const bool ready = fwd ? (s == 0 || done[{s - 1, 0, pass.micro}])
                             : (s == p - 1 ? done[{s, 0, pass.micro}] : done[{s + 1, 1, pass.micro}]);
      if (!ready) continue;
      done[{s, fwd ? 0 : 1, pass.micro}] = true;
      ++i, ++completed, moved = true;
    }
  }
  return completed;
}

TEST(PipelineSchedule, EachMicroBatchRunsForwardThenBackwardOncePerStage) {
  for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B})
    for (int64_t p : {1, 2, 3, 4})
      for (int64_t m : {1, 2, 3, 8})
        for (int64_t s = 0; s < p; ++s) {
          const auto passes = pipeline_passes(schedule, s, p, m);
          ASSERT_EQ(passes.size(), static_cast<size_t>(2 * m));
          for (int64_t i = 0; i < m; ++i) {
            const auto f = std::find(passes.begin(), passes.end(), PipelinePass{K::kForward, i});
            const auto b = std::find(passes.begin(), passes.end(), PipelinePass{K::kBackward, i});
            ASSERT_TRUE(f != passes.end() && b != passes.end() && f < b) << describe_passes(passes);
          }
          EXPECT_EQ(passes.back(), (PipelinePass{K::kBackward, m - 1})) << "the last backward completes the gradients";
        }
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostPMinusSActivations) {
  for (int64_t p : {2, 4})
    for (int64_t s = 0; s < p; ++s) {
      EXPECT_EQ(peak_in_flight(pipeline_passes(PipelineSchedule::k1F1B, s, p, 8)), p - s);
      EXPECT_EQ(peak_in_flight(pipeline_passes(PipelineSchedule::kGPipe, s, p, 8)), 8);
    }
  EXPECT_EQ(describe_passes(pipeline_passes(PipelineSchedule::k1F1B, 0, 3, 4)), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(describe_passes(pipeline_passes(PipelineSchedule::k1F1B, 2, 3, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(describe_passes(pipeline_passes(PipelineSchedule::kGPipe, 1, 3, 2)), "F0 F1 B0 B1");
}

TEST(PipelineSchedule, TheStagesTogetherNeverDeadlock) {
  for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B})
    for (int64_t p : {1, 2, 3, 4, 8})
      for (int64_t m : {1, 2, 5, 8, 16}) EXPECT_EQ(simulate(schedule, p, m), static_cast<size_t>(2 * p * m));
}

TEST(PipelineSchedule, TheBubbleIsPMinusOneOverMPlusPMinusOne) {
  EXPECT_DOUBLE_EQ(pipeline_bubble(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(2, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(4, 8), 3.0 / 11.0);
}

// Equal busy times give (p - 1) / (m + p - 1); a slower stage adds its surplus on every micro-batch.
TEST(PipelineSchedule, TheBubbleOfUnequalStagesCountsTheSlowestOnEveryMicroBatch) {
  EXPECT_DOUBLE_EQ(pipeline_bubble(std::vector<double>{0.8, 0.8}, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(std::vector<double>{0.4, 0.4, 0.4, 0.4}, 8), 3.0 / 11.0);
  // Stage times 1 and 2 per micro-batch, m = 4: span 3 + 3 * 2 = 9, mean busy (4 + 8) / 2 = 6.
  EXPECT_DOUBLE_EQ(pipeline_bubble(std::vector<double>{4.0, 8.0}, 4), 1.0 - 6.0 / 9.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(std::vector<double>{0.5}, 8), 0.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(std::vector<double>{}, 8), 0.0);
}

}  // namespace
}  // namespace tandem
