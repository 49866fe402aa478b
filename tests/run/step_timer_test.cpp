// Note [Step time split] on the CPU device (run/step_timer.h): each span goes to the phase its ending
// mark names, repeated phases add up, idle is the wall time the spans leave (never negative), and a
// new step forgets the last one's marks. The CUDA path (events on the compute stream) needs a GPU.
#include "tandem/run/step_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using Phase = StepTimer::Phase;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(StepTimer, EachSpanGoesToThePhaseItsEndingMarkNames) {
  StepTimer timer{c10::Device(c10::kCPU)};
  const auto t0 = Clock::now();
  timer.begin();
  sleep_ms(30);
  timer.mark(Phase::kBackward);  // no forward at all: the span is the backward's
  sleep_ms(10);
  timer.mark(Phase::kUpdate);
  const double wall = since(t0);
  const StepPhases p = timer.read(wall);
  EXPECT_EQ(p.forward_s, 0.0) << "no mark ended a forward";
  EXPECT_GE(p.backward_s, 0.030);
  EXPECT_GE(p.update_s, 0.010);
  EXPECT_LE(p.backward_s + p.update_s, wall) << "the spans lie within the step";
}

TEST(StepTimer, MicroBatchesOfOnePhaseAddUp) {
  StepTimer timer{c10::Device(c10::kCPU)};
  timer.begin();
  sleep_ms(15);
  timer.mark(Phase::kForward);
  timer.mark(Phase::kBackward);
  sleep_ms(15);
  timer.mark(Phase::kForward);
  timer.mark(Phase::kBackward);
  timer.mark(Phase::kUpdate);
  const StepPhases p = timer.read(10.0);
  EXPECT_GE(p.forward_s, 0.030) << "two forwards of at least 15 ms each";
  EXPECT_NEAR(p.idle_s, 10.0 - p.forward_s - p.backward_s - p.update_s, 1e-12);
}

TEST(StepTimer, IdleIsNeverNegative) {
  StepTimer timer{c10::Device(c10::kCPU)};
  timer.begin();
  sleep_ms(5);
  timer.mark(Phase::kForward);
  const StepPhases p = timer.read(0.0);  // a wall time shorter than the spans (clocks read apart)
  EXPECT_GT(p.forward_s, 0.0);
  EXPECT_EQ(p.idle_s, 0.0);
}

TEST(StepTimer, ANewStepForgetsThePreviousMarks) {
  StepTimer timer{c10::Device(c10::kCPU)};
  timer.begin();
  sleep_ms(20);
  timer.mark(Phase::kForward);
  timer.mark(Phase::kBackward);
  timer.mark(Phase::kUpdate);
  ASSERT_GE(timer.read(1.0).forward_s, 0.020);

  // The second step reuses the marks' storage but only its own marks count.
  timer.begin();
  timer.mark(Phase::kUpdate);
  const StepPhases p = timer.read(1.0);
  EXPECT_EQ(p.forward_s, 0.0);
  EXPECT_EQ(p.backward_s, 0.0);
  EXPECT_GE(p.update_s, 0.0);
  EXPECT_NEAR(p.idle_s, 1.0 - p.update_s, 1e-12);
}

TEST(StepTimer, ReadingWithoutMarksIsAllIdle) {
  StepTimer timer{c10::Device(c10::kCPU)};
  StepPhases p = timer.read(0.5);
  EXPECT_EQ(p.forward_s + p.backward_s + p.update_s, 0.0);
  EXPECT_DOUBLE_EQ(p.idle_s, 0.5);
  timer.begin();  // the origin alone measures nothing
  p = timer.read(0.25);
  EXPECT_EQ(p.forward_s + p.backward_s + p.update_s, 0.0);
  EXPECT_DOUBLE_EQ(p.idle_s, 0.25);
}

}  // namespace
}  // namespace tandem
