// Note [Adaptive micro-batch]'s policy (run/micro_batch_split.h): each out-of-memory error doubles
// the parts of a micro-batch, never past one row a part; clean steps grow it back; the refusals
// name their fix.
#include "tandem/run/micro_batch_split.h"

#include <gtest/gtest.h>

#include "../error_of.h"

namespace tandem {
namespace {

TrainConfig policy(bool retry, int64_t grow_after) {
  TrainConfig t;
  t.oom_retry = retry;
  t.oom_grow_after = grow_after;
  return t;
}

TEST(MicroBatchSplit, AnUncutRunReportsNothing) {
  MicroBatchSplit s(policy(true, 0));
  EXPECT_EQ(s.parts(8), 1);
  EXPECT_FALSE(s.cut());
  EXPECT_EQ(s.after_step(), 0) << "no row field while uncut";
  EXPECT_EQ(s.accumulation(3), 3);
}

TEST(MicroBatchSplit, EachErrorDoublesThePartsUpToOneRowAPart) {
  MicroBatchSplit s(policy(true, 0));
  s.split_further(0, "CUDA out of memory", 6);
  EXPECT_EQ(s.parts(6), 2);
  EXPECT_EQ(s.part_rows(), 3);
  EXPECT_EQ(s.accumulation(4), 8);
  s.split_further(0, "CUDA out of memory", 6);
  EXPECT_EQ(s.parts(6), 4);
  EXPECT_EQ(s.part_rows(), 2) << "6 rows in 4 parts: at most 2 a part";
  s.split_further(0, "CUDA out of memory", 6);
  EXPECT_EQ(s.parts(6), 6) << "8 parts of 6 rows are 6 parts of one row";
  EXPECT_EQ(s.parts(3), 3);
  EXPECT_EQ(s.retries(), 3);
  const std::string err = test::error_of([&] { s.split_further(4, "CUDA out of memory", 6); });
  EXPECT_NE(err.find("out of memory at step 5 even at micro-batch 1"), std::string::npos) << err;
  EXPECT_NE(err.find("model.checkpointing=true"), std::string::npos) << err;
  EXPECT_EQ(s.retries(), 3) << "a refused retry is not counted";
}

TEST(MicroBatchSplit, WithoutRetriesTheFirstErrorEndsWithTheKey) {
  MicroBatchSplit s(policy(false, 0));
  const std::string err = test::error_of([&] { s.split_further(0, "CUDA out of memory", 8); });
  EXPECT_NE(err.find("train.oom_retry=true"), std::string::npos) << err;
  EXPECT_EQ(s.parts(8), 1);
}

TEST(MicroBatchSplit, CleanStepsGrowItBackOnePartAtATime) {
  MicroBatchSplit s(policy(true, 2));
  s.split_further(0, "oom", 8);
  s.split_further(0, "oom", 8);  // 4 parts of 2 rows
  bool grew = true;
  EXPECT_EQ(s.after_step(&grew), 2);
  EXPECT_FALSE(grew);
  EXPECT_EQ(s.after_step(&grew), 2) << "the step that ran had 2-row parts";
  EXPECT_TRUE(grew);
  EXPECT_EQ(s.parts(8), 2);
  EXPECT_EQ(s.after_step(&grew), 4);
  EXPECT_EQ(s.after_step(&grew), 4);
  EXPECT_TRUE(grew);
  EXPECT_FALSE(s.cut());
  EXPECT_EQ(s.after_step(&grew), 0);
  EXPECT_FALSE(grew);
}

TEST(MicroBatchSplit, ANewErrorRestartsTheCleanCount) {
  MicroBatchSplit s(policy(true, 2));
  s.split_further(0, "oom", 8);
  s.after_step();  // one clean step
  s.split_further(1, "oom", 8);
  s.after_step();
  EXPECT_EQ(s.parts(8), 4) << "one clean step since the last error: not grown yet";
  s.after_step();
  EXPECT_EQ(s.parts(8), 2);
}

TEST(MicroBatchSplit, WithoutGrowAfterTheCutStays) {
  MicroBatchSplit s(policy(true, 0));
  s.split_further(0, "oom", 8);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.after_step(), 4);
  EXPECT_EQ(s.parts(8), 2);
}

}  // namespace
}  // namespace tandem
