// The learning-rate schedule (run/lr_schedule.h): linear warmup from optim.warmup_min_lr, then
// cosine, linear or constant down to lr * min_lr_ratio at optim.decay_steps (train.steps when 0),
// held there after it.
#include "tandem/run/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tandem {
namespace {

OptimConfig schedule(LrSchedule kind, int64_t warmup, double lr = 1.0, double min_ratio = 0.1) {
  OptimConfig o;
  o.schedule = kind;
  o.warmup_steps = warmup;
  o.lr = lr;
  o.min_lr_ratio = min_ratio;
  o.warmup_min_lr = 0.0;
  o.decay_steps = 0;
  return o;
}

TEST(LrSchedule, WarmupRisesLinearlyAndReachesTheRateOnItsLastStep) {
  OptimConfig o = schedule(LrSchedule::kCosine, 4, 2.0);
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 100), 0.5) << "step 0 already takes the first quarter";
  EXPECT_DOUBLE_EQ(lr_at(o, 1, 100), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(o, 2, 100), 1.5);
  EXPECT_DOUBLE_EQ(lr_at(o, 3, 100), 2.0);
  EXPECT_DOUBLE_EQ(lr_at(o, 4, 100), 2.0) << "the decay starts from the full rate";
  o.warmup_min_lr = 0.4;
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 100), 0.4 + 1.6 * 0.25);
  EXPECT_DOUBLE_EQ(lr_at(o, 3, 100), 2.0);
}

TEST(LrSchedule, CosineFallsToTheFloorAtTheLastStepAndStaysThere) {
  const OptimConfig o = schedule(LrSchedule::kCosine, 0);
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 10), 1.0);
  EXPECT_NEAR(lr_at(o, 5, 10), 0.1 + 0.9 * 0.5, 1e-12) << "half-way: the middle of the range";
  EXPECT_NEAR(lr_at(o, 2, 10), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.2)), 1e-12);
  EXPECT_NEAR(lr_at(o, 10, 10), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(o, 25, 10), 0.1, 1e-12) << "past the end: the floor, not a second period";
  double prev = lr_at(o, 0, 10);
  for (int64_t s = 1; s <= 12; ++s) {
    const double lr = lr_at(o, s, 10);
    EXPECT_LE(lr, prev) << "step " << s;
    prev = lr;
  }
}

TEST(LrSchedule, LinearFallsByEqualStepsToTheFloor) {
  const OptimConfig o = schedule(LrSchedule::kLinear, 0);
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 10), 1.0);
  EXPECT_NEAR(lr_at(o, 2, 10), 1.0 - 0.9 * 0.2, 1e-12);
  EXPECT_NEAR(lr_at(o, 5, 10), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(o, 6, 10) - lr_at(o, 7, 10), lr_at(o, 1, 10) - lr_at(o, 2, 10), 1e-12);
  EXPECT_NEAR(lr_at(o, 10, 10), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(o, 11, 10), 0.1, 1e-12);
}

TEST(LrSchedule, ConstantKeepsTheRateAfterWarmup) {
  const OptimConfig o = schedule(LrSchedule::kConstant, 2, 3e-4, 0.1);
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 10), 1.5e-4);
  for (const int64_t s : {2, 5, 10, 1000}) EXPECT_DOUBLE_EQ(lr_at(o, s, 10), 3e-4) << "step " << s;
}

TEST(LrSchedule, TheDecaySpansFromTheWarmupsEndToDecaySteps) {
  OptimConfig o = schedule(LrSchedule::kLinear, 2);
  // After a warmup of 2 the decay runs over steps 2 .. 12 of a 12-step run.
  EXPECT_NEAR(lr_at(o, 7, 12), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(o, 12, 12), 0.1, 1e-12);
  // decay_steps replaces the run's length: the floor is reached at step 6 of a 100-step run.
  o.decay_steps = 6;
  EXPECT_NEAR(lr_at(o, 4, 100), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(o, 6, 100), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(o, 50, 100), 0.1, 1e-12);
}

TEST(LrSchedule, ARunNoLongerThanItsWarmupDropsToTheFloorRightAfterIt) {
  // end - warmup <= 0: the span is one step, so nothing divides by zero.
  const OptimConfig o = schedule(LrSchedule::kCosine, 5);
  EXPECT_DOUBLE_EQ(lr_at(o, 4, 5), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(o, 5, 5), 1.0);
  EXPECT_NEAR(lr_at(o, 6, 5), 0.1, 1e-12);
  EXPECT_TRUE(std::isfinite(lr_at(o, 5, 3)));
}

TEST(LrSchedule, AFloorRatioOfOneHoldsTheRate) {
  const OptimConfig o = schedule(LrSchedule::kCosine, 0, 2e-3, 1.0);
  for (const int64_t s : {0, 3, 9, 20}) EXPECT_NEAR(lr_at(o, s, 10), 2e-3, 1e-15) << "step " << s;
}

}  // namespace
}  // namespace tandem
