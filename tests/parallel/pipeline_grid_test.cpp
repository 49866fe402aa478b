// Note [Pipeline parallel]: the pp x dp grid is stage-major; stage cuts from dist.pipeline_cut or
// equal counts, bad ones refused with the fix.
#include <gtest/gtest.h>

#include "../error_of.h"
#include "tandem/core/config_values.h"
#include "tandem/parallel/pipeline_grid.h"

namespace tandem {
namespace {

TEST(PipelineGrid, RanksAreStageMajorWithReplicasInside) {
  const PipelineGrid g(5, 8, 4);  // 4 stages x 2 replicas
  EXPECT_EQ(g.stage(), 2);
  EXPECT_EQ(g.replica(), 1);
  EXPECT_EQ(g.previous_rank(), 3);
  EXPECT_EQ(g.next_rank(), 7);
  EXPECT_EQ(g.replica_ranks(), (std::vector<int>{4, 5}));
  EXPECT_FALSE(g.first_stage());
  EXPECT_FALSE(g.last_stage());
  EXPECT_TRUE(PipelineGrid(7, 8, 4).last_stage());
  EXPECT_EQ(g.describe(), "stage 2 of 4, replica 1 of 2");
}

TEST(PipelineGrid, ABadWorldOrCutIsRefusedWithTheFix) {
  EXPECT_NE(test::error_of([] { PipelineGrid(0, 6, 4); }).find("does not divide the world of 6"), std::string::npos);
  EXPECT_NE(test::error_of([] { even_pipeline_cut(7, 6); }).find("more stages than the model's 6 Blocks"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { given_pipeline_cut({2}, 3, 6); }).find("gives 1 ends for 3 stages"), std::string::npos);
  EXPECT_NE(test::error_of([] { given_pipeline_cut({4, 2}, 3, 6); }).find("must rise strictly"), std::string::npos);
  EXPECT_NE(test::error_of([] { given_pipeline_cut({2, 6}, 3, 6); }).find("must rise strictly"), std::string::npos);
  EXPECT_NE(test::error_of([] { PipelineCut::parse("a,3"); }).find("not a comma list"), std::string::npos);
}

TEST(PipelineGrid, CutsCoverEveryBlockOnce) {
  EXPECT_EQ(even_pipeline_cut(4, 6), (std::vector<int64_t>{2, 4, 5, 6}));
  EXPECT_EQ(even_pipeline_cut(1, 6), (std::vector<int64_t>{6}));
  EXPECT_EQ(given_pipeline_cut({1, 5}, 3, 6), (std::vector<int64_t>{1, 5, 6}));
}

}  // namespace
}  // namespace tandem
