// The step stamps on the CPU device (the host clock): spans between stamps, unset and cleared
// stamps, and the per-Block times read from them.

#include "tandem/engine/step_stamps.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

void at(Stamp& st, double host_s) {
  st.host = host_s;
  st.set = true;
}

TEST(StepStamps, BetweenIsTheDifferenceOfTwoSetStampsAndZeroOtherwise) {
  Stamp a, b, unset;
  at(a, 1.25);
  at(b, 4.0);
  EXPECT_DOUBLE_EQ(between(a, b), 2.75);
  EXPECT_DOUBLE_EQ(between(b, a), -2.75);
  EXPECT_EQ(between(a, unset), 0.0);
  EXPECT_EQ(between(unset, b), 0.0);
  // On the host clock a stamp is complete once set.
  EXPECT_DOUBLE_EQ(completed_between(a, b), 2.75);
  EXPECT_EQ(completed_between(a, unset), 0.0);
}

TEST(StepStamps, MarkReadsTheHostClockSinceTheEpoch) {
  StepStamps st(3, /*cuda=*/false);
  EXPECT_EQ(st.fwd.size(), 3u);
  EXPECT_FALSE(st.fwd[0].ev);  // no CUDA events on the CPU device
  EXPECT_FALSE(st.fwd[1].set);
  const double before = st.host_now();
  st.mark(st.fwd[1], nullptr);
  const double after = st.host_now();
  EXPECT_TRUE(st.fwd[1].set);
  EXPECT_GE(st.fwd[1].host, before);
  EXPECT_LE(st.fwd[1].host, after);
  EXPECT_GE(before, 0.0);
}

TEST(StepStamps, ClearUnsetsEveryStampButTheReference) {
  StepStamps st(2, false);
  for (auto* v : {&st.arrive, &st.fwd, &st.bwd, &st.d2h0, &st.d2h1, &st.h2d0, &st.h2d1})
    for (auto& x : *v) at(x, 1.0);
  at(st.gpu0, 1.0);
  at(st.gpu1, 2.0);
  at(st.ref, 0.5);
  st.clear();
  for (auto* v : {&st.arrive, &st.fwd, &st.bwd, &st.d2h0, &st.d2h1, &st.h2d0, &st.h2d1})
    for (auto& x : *v) EXPECT_FALSE(x.set);
  EXPECT_FALSE(st.gpu0.set);
  EXPECT_FALSE(st.gpu1.set);
  EXPECT_TRUE(st.ref.set);
}

TEST(StepStamps, PerBlockTimesFollowForwardAndBackwardOrder) {
  // 4 Blocks: forwards start at 0, 1, 3, 6; backward ends (reverse order) head 10, then 12, 15, 19.
  StepStamps st(4, false);
  const double fwd[] = {0, 1, 3, 6}, bwd[] = {19, 15, 12, 10};
  for (size_t i = 0; i < 4; ++i) {
    at(st.fwd[i], fwd[i]);
    at(st.bwd[i], bwd[i]);
  }
  at(st.d2h0[2], 12.5);
  at(st.d2h1[2], 13.0);
  at(st.h2d0[2], 20.0);
  at(st.h2d1[2], 20.25);
  at(st.gpu0, 19.0);
  at(st.gpu1, 19.5);
  EXPECT_DOUBLE_EQ(st.forward_s(0), 1.0);
  EXPECT_DOUBLE_EQ(st.forward_s(2), 3.0);
  EXPECT_DOUBLE_EQ(st.backward_s(0), 4.0);  // Block 1's gradients at 15, Block 0's at 19
  EXPECT_DOUBLE_EQ(st.backward_s(2), 2.0);
  EXPECT_DOUBLE_EQ(st.last_block_s(), 4.0);  // the head: forward at 6, backward done at 10
  EXPECT_DOUBLE_EQ(st.d2h_s(2), 0.5);
  EXPECT_DOUBLE_EQ(st.h2d_s(2), 0.25);
  EXPECT_EQ(st.d2h_s(1), 0.0);  // never copied
  EXPECT_DOUBLE_EQ(st.device_update_s(), 0.5);
  // The embedding and the head count 0; a layer its forward plus its backward.
  const auto s = st.block_seconds();
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0], 0.0);
  EXPECT_DOUBLE_EQ(s[1], 2.0 + 3.0);
  EXPECT_DOUBLE_EQ(s[2], 3.0 + 2.0);
  EXPECT_EQ(s[3], 0.0);
}

TEST(StepStamps, AForwardEndsWhereTheNextBlockArrivesNotWhereItStarts) {
  // Block 2 arrives at 3 but waits for its upload until 5; Block 3 starts when it arrives, at 8.
  StepStamps st(4, false);
  const double arrive[] = {0, 1, 3, 8}, fwd[] = {0, 1, 5, 8}, bwd[] = {21, 17, 14, 12};
  for (size_t i = 0; i < 4; ++i) {
    at(st.arrive[i], arrive[i]);
    at(st.fwd[i], fwd[i]);
    at(st.bwd[i], bwd[i]);
  }
  EXPECT_DOUBLE_EQ(st.forward_s(0), 1.0);
  EXPECT_DOUBLE_EQ(st.forward_s(1), 2.0);  // to Block 2's arrival: its 2 s wait is not Block 1's forward
  EXPECT_DOUBLE_EQ(st.forward_s(2), 3.0);
  EXPECT_DOUBLE_EQ(st.block_seconds()[1], 2.0 + 3.0);
  // No arrival stamped (a step before the engine stamped them, or cleared): the next start stands in.
  st.arrive[2].set = false;
  EXPECT_DOUBLE_EQ(st.forward_s(1), 4.0);
  st.clear();
  at(st.fwd[1], 1.0);
  at(st.fwd[2], 5.0);
  EXPECT_DOUBLE_EQ(st.forward_s(1), 4.0);
}

}  // namespace
}  // namespace tandem
