// RunFeed: sequence numbers, thinning past the cap, following a metrics.jsonl as it grows.

#include <gtest/gtest.h>

#include <fstream>

#include "tandem/monitor/run_feed.h"
#include "../test_util.h"

namespace tandem {
namespace {

TEST(RunFeed, SinceReturnsOnlyNewRowsAndSamples) {
  RunFeed feed;
  feed.add_row({{"step", 1}, {"loss", 3.0}});
  feed.add_sample({{"t_s", 0.5}, {"gpu_power_w", 300.0}});
  auto all = feed.since(0, 0);
  EXPECT_EQ(all["rows"].size(), 1u);
  EXPECT_EQ(all["samples"].size(), 1u);
  EXPECT_EQ(all["next_row"], 1);
  feed.add_row({{"step", 2}, {"loss", 2.5}, {"energy_gpu_j", 10.0}});
  feed.add_row({{"step", 2}, {"eval_loss", 2.7}});
  auto fresh = feed.since(all["next_row"].get<int64_t>(), all["next_sample"].get<int64_t>());
  ASSERT_EQ(fresh["rows"].size(), 2u);
  EXPECT_EQ(fresh["rows"][0]["step"], 2);
  EXPECT_EQ(fresh["samples"].size(), 0u);
  EXPECT_EQ(feed.latest_row()["loss"], 2.5);  // evaluation rows are not step rows
  const auto t = feed.totals();
  EXPECT_EQ(t.step_rows, 2);
  EXPECT_DOUBLE_EQ(t.energy_gpu_j, 10.0);
  EXPECT_DOUBLE_EQ(t.eval_loss, 2.7);
  EXPECT_FALSE(feed.done());
  feed.finish();
  EXPECT_TRUE(feed.since(0, 0)["done"].get<bool>());
}

TEST(RunFeed, PastTheCapTheOlderHalfIsThinnedAndTheNewestKept) {
  RunFeed feed(64, 64);
  for (int i = 1; i <= 1000; ++i) feed.add_row({{"step", i}, {"loss", 1.0 / i}});
  const auto rows = feed.since(0, 0)["rows"];
  EXPECT_LE(rows.size(), 64u);
  EXPECT_GE(rows.size(), 32u);
  EXPECT_EQ(rows.front()["step"], 1);    // the start of the run survives thinning
  EXPECT_EQ(rows.back()["step"], 1000);  // and the newest row
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1]["step"], rows[i]["step"]);
}

TEST(RunFeed, FollowReadsAppendedLinesAndWaitsForAnIncompleteOne) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  RunFeed feed;
  feed.follow(path);  // not there yet: nothing, no error
  EXPECT_EQ(feed.since(0, 0)["rows"].size(), 0u);
  {
    std::ofstream out(path);
    out << R"({"step":1,"loss":3.0,"t_s":0.1,"gpu_power_w":250})" << "\n" << R"({"step":2,"lo)";
  }
  feed.follow(path);
  auto j = feed.since(0, 0);
  ASSERT_EQ(j["rows"].size(), 1u);
  ASSERT_EQ(j["samples"].size(), 1u);  // a finished run's telemetry comes from its step rows
  EXPECT_EQ(j["samples"][0]["gpu_power_w"], 250);
  EXPECT_FALSE(j["samples"][0].contains("loss"));
  {
    std::ofstream out(path, std::ios::app);
    out << R"(ss":2.5,"t_s":0.2})" << "\n" << "not json\n";
  }
  feed.follow(path);
  j = feed.since(0, 0);
  ASSERT_EQ(j["rows"].size(), 2u);  // the completed line; the foreign one skipped
  EXPECT_EQ(j["rows"][1]["loss"], 2.5);
}

}  // namespace
}  // namespace tandem
