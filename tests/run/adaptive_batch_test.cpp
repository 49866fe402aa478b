// Out-of-memory recovery (Note [Adaptive micro-batch]): injected through
// TANDEM_FAULTS=oom_above_tokens (Note [Test faults]), a step is retried with half the micro-batch and twice the
// accumulation, on the same samples, so the run's losses follow the run that never ran out.

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "tandem/core/fault.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

void expect_same_losses(const TrainSummary& a, const TrainSummary& b, double rtol) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], rtol * std::abs(b.losses[i])) << "step " << i + 1;
}

TEST(AdaptiveMicroBatch, AnOomIsRetriedOnTheSameSamplesAndTheLossesFollowTheRunWithout) {
  for (const bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "offload engine" : "plain optimizer");
    test::TempDir ref_dir, oom_dir;
    Config c = test::tiny_cpu_config(ref_dir.path(), 12);
    c.train.grad_accum = 2;
    if (offload) c.offload.optimizer = OffloadTarget::kCpu, c.offload.update_split = "0.5";  // not timing-driven
    const TrainSummary ref = train(c, {});
    Config o = c;
    o.train.run_dir = oom_dir.path();
    const FaultScope oom("oom_above_tokens=" +
                         std::to_string(8 * 64 / 2 - 1));  // a full micro-batch fails, a quarter fits
    const TrainSummary got = train(o, {});
    EXPECT_EQ(got.oom_retries, 2) << "8 rows -> 4 -> 2";
    EXPECT_EQ(got.final_step, 12);
    // fp32: the same samples, summed in another order; the difference (1e-7 relative in the first
    // step's gradients) grows through 12 steps of training at lr 3e-3 to about 1e-5.
    expect_same_losses(got, ref, 1e-4);
    const std::string metrics = test::read_text(oom_dir.file("metrics.jsonl"));
    EXPECT_NE(metrics.find("\"oom\""), std::string::npos);
    EXPECT_NE(metrics.find("\"micro_batch_effective\":2"), std::string::npos);
  }
}

TEST(AdaptiveMicroBatch, GrowingBackAfterCleanStepsKeepsTheLosses) {
  test::TempDir ref_dir, oom_dir;
  Config c = test::tiny_cpu_config(ref_dir.path(), 10);
  const TrainSummary ref = train(c, {});
  Config o = c;
  o.train.run_dir = oom_dir.path();
  o.train.oom_grow_after = 3;                                              // every third clean step it tries 8 again
  const FaultScope oom("oom_above_tokens=" + std::to_string(8 * 64 / 2));  // 4 rows fit
  const TrainSummary got = train(o, {});
  EXPECT_EQ(got.oom_retries, 4) << "8 rows fail at step 1, and again after each 3 clean steps: 4, 7, 10";
  expect_same_losses(got, ref, 1e-4);
}

TEST(AdaptiveMicroBatch, AtMicroBatchOneItEndsWithTheFix) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 3);
  const std::string err = test::error_of([&] {
    const FaultScope oom("oom_above_tokens=32");  // not even one 64-token row fits
    train(c, {});
  });
  EXPECT_NE(err.find("even at micro-batch 1"), std::string::npos) << err;
  EXPECT_NE(err.find("model.checkpointing=true"), std::string::npos) << err;
  test::TempDir again;  // a run directory holds one run
  c.train.run_dir = again.path();
  c.train.oom_retry = false;
  const std::string off = test::error_of([&] {
    const FaultScope oom("oom_above_tokens=100");
    train(c, {});
  });
  EXPECT_NE(off.find("train.oom_retry=true"), std::string::npos) << off;
}

}  // namespace
}  // namespace tandem
