// Note [Test faults]: the one mechanism tests use to make failures happen.
#include "tandem/core/fault.h"

#include <gtest/gtest.h>

#include <csignal>

#include "../error_of.h"

namespace tandem {
namespace {

TEST(Faults, EntriesParse) {
  const Faults f = parse_faults(
      "kill_after_step=1:15, stop_after_step=0:3,every_attempt=1,kill_in_checkpoint=6,"
      "oom_above_tokens=255");
  EXPECT_EQ(f.kill_rank, 1);
  EXPECT_EQ(f.kill_step, 15);
  EXPECT_EQ(f.stop_rank, 0);
  EXPECT_EQ(f.stop_step, 3);
  EXPECT_TRUE(f.every_attempt);
  EXPECT_EQ(f.kill_in_checkpoint, 6);
  EXPECT_EQ(f.oom_above_tokens, 255);
  const Faults none = parse_faults("");
  EXPECT_EQ(none.kill_rank, -1);
  EXPECT_EQ(none.oom_above_tokens, 0);
}

TEST(Faults, BadEntriesNameThemselves) {
  EXPECT_NE(test::error_of([] { parse_faults("kill_after_step=3"); }).find("takes RANK:STEP"), std::string::npos);
  EXPECT_NE(test::error_of([] { parse_faults("oom=5"); }).find("unknown fault 'oom'"), std::string::npos);
  EXPECT_NE(test::error_of([] { parse_faults("kill_in_checkpoint=x"); }).find("needs a number"), std::string::npos);
  EXPECT_NE(test::error_of([] { parse_faults("every_attempt"); }).find("NAME=VALUE"), std::string::npos);
}

TEST(Faults, AScopeArmsAndDisarms) {
  ASSERT_FALSE(fault_oom(1 << 20)) << "nothing armed in the test process";
  {
    const FaultScope scope("oom_above_tokens=100");
    EXPECT_TRUE(fault_oom(101));
    EXPECT_FALSE(fault_oom(100));
    fault_after_step(0, 1, 0);  // armed for nothing else: returns
    fault_in_checkpoint(1);
  }
  EXPECT_FALSE(fault_oom(101));
  EXPECT_EQ(armed_faults(), nullptr);
}

TEST(Faults, AKillAfterAStepEndsThatRankOnly) {
  const FaultScope scope("kill_after_step=1:2");
  fault_after_step(0, 2, 0);  // another rank
  fault_after_step(1, 1, 0);  // another step
  fault_after_step(1, 2, 1);  // a restarted attempt, not every_attempt
  EXPECT_EXIT(fault_after_step(1, 2, 0), testing::KilledBySignal(SIGKILL), "");
}

}  // namespace
}  // namespace tandem
