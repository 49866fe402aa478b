#include <gtest/gtest.h>

#include <numeric>

#include "tandem/core/error.h"
#include "tandem/sched/batch_balance.h"

namespace tandem {
namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

TEST(BatchBalance, RowsFollowSpeed) {
  // Rank 1 takes a third of rank 0's time per row: three times the rows.
  EXPECT_EQ(balance_rows({3e-3, 1e-3}, {100, 100}, 16), (std::vector<int64_t>{4, 12}));
  EXPECT_EQ(balance_rows({1e-3, 1e-3, 1e-3, 1e-3}, {100, 100, 100, 100}, 16), (std::vector<int64_t>{4, 4, 4, 4}));
}

TEST(BatchBalance, EveryRankKeepsOneRowAndTheSumHolds) {
  const auto r = balance_rows({1.0, 1e-6, 1e-6}, {100, 100, 100}, 9);
  EXPECT_EQ(sum(r), 9);
  for (const auto x : r) EXPECT_GE(x, 1);
}

TEST(BatchBalance, MemoryCapsMoveRowsToTheOthers) {
  // The fast rank fits only 5 rows: the rest go to the slower one.
  const auto r = balance_rows({2e-3, 1e-3}, {100, 5}, 16);
  EXPECT_EQ(r, (std::vector<int64_t>{11, 5}));
  EXPECT_THROW(balance_rows({1e-3, 1e-3}, {3, 3}, 8), UserError);
}

TEST(BatchBalance, RoundingGivesLeftoverRowsToTheLargestRemainders) {
  const auto r = balance_rows({1e-3, 1e-3, 1e-3}, {100, 100, 100}, 10);
  EXPECT_EQ(sum(r), 10);
  EXPECT_EQ(*std::max_element(r.begin(), r.end()) - *std::min_element(r.begin(), r.end()), 1);
}

}  // namespace
}  // namespace tandem
