// Note [Data parallel]: rows per rank from dist.balance (rebalancing runs across processes in
// tests/parallel).
#include "tandem/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include "../error_of.h"

namespace tandem {
namespace {

RankInfo rank_of(int rank, int world) {
  RankInfo r;
  r.rank = rank;
  r.world_size = world;
  return r;
}

TEST(DataParallelRows, EqualRowsPerRankTileTheGlobalBatch) {
  Config c;
  c.train.micro_batch = 4;
  for (int r = 0; r < 3; ++r) {
    const DataParallelRows rows(c, rank_of(r, 3));
    EXPECT_EQ(rows.global_rows(), 12);
    EXPECT_EQ(rows.rows(), 4);
    EXPECT_EQ(rows.first_row(), 4 * r);
    EXPECT_DOUBLE_EQ(rows.share(), 1.0 / 3.0);
    EXPECT_FALSE(rows.balances_at(10, 0)) << "equal never rebalances";
  }
}

TEST(DataParallelRows, AGivenListSetsEachRanksRows) {
  Config c;
  c.train.micro_batch = 4;
  c.dist.balance = RowBalance::parse("5,3");
  const DataParallelRows r0(c, rank_of(0, 2)), r1(c, rank_of(1, 2));
  EXPECT_EQ(r0.rows(), 5);
  EXPECT_EQ(r1.rows(), 3);
  EXPECT_EQ(r1.first_row(), 5);
  EXPECT_DOUBLE_EQ(r0.share() + r1.share(), 1.0);
}

TEST(DataParallelRows, AutoMeasuresOnceAfterBalanceAfterSteps) {
  Config c;
  c.dist.balance = RowBalance::parse("auto");
  c.dist.balance_after = 4;
  const DataParallelRows rows(c, rank_of(0, 2));
  EXPECT_FALSE(rows.balances_at(3, 0));
  EXPECT_TRUE(rows.balances_at(4, 0));
  EXPECT_TRUE(rows.balances_at(14, 10)) << "counted from the resumed step";
  EXPECT_FALSE(DataParallelRows(c, rank_of(0, 1)).balances_at(4, 0)) << "one rank has nothing to balance";
}

TEST(DataParallelRows, BadListsAreRefusedWithTheFix) {
  Config c;
  c.train.micro_batch = 4;
  const auto err = [&](const std::string& balance) {
    return test::error_of([&] {
      c.dist.balance = RowBalance::parse(balance);
      DataParallelRows(c, rank_of(0, 2));
    });
  };
  EXPECT_NE(err("8").find("gives 1 row counts for 2 ranks"), std::string::npos);
  EXPECT_NE(err("4,5").find("sums to 9"), std::string::npos);
  EXPECT_NE(err("8,0").find("is not a list of row counts"), std::string::npos);
  EXPECT_NE(err("4x,4").find("is not a list of row counts"), std::string::npos);
}

}  // namespace
}  // namespace tandem
