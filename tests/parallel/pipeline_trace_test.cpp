// A pipeline step's trace (parallel/pipeline_trace.h): rank 0 alone draws a track per stage with
// its first replica's passes in the schedule's order and times; an unwritable path is not an error.
// Ranks are threads on loopback Gloo.

#include "tandem/parallel/pipeline_trace.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../test_util.h"
#include "comm_threads.h"
#include "stage_fixture.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;

// 2 stages x 2 replicas, 1F1B over 3 micro-batches: stage 0 runs F0 F1 B0 F2 B1 B2, stage 1
// F0 B0 F1 B1 F2 B2; the tracks hold ranks 0's and 2's passes, not their replicas'.
TEST(PipelineTrace, RankZeroDrawsEachStagesFirstReplicaPassByPass) {
  constexpr int kWorld = 4, kStages = 2;
  constexpr int64_t m = 3;
  TempDir tmp;
  std::vector<StageTimes> times(kWorld);
  const auto errors = on_ranks(kWorld, kStages, port(10), [&](Comm& comm) {
    StageFixture stage(comm, kStages, PipelineSchedule::k1F1B);
    times[static_cast<size_t>(comm.rank())] = stage.run_step(m);
    write_pipeline_trace(comm, stage.parts, *stage.model, /*step=*/7, m,
                         tmp.file("trace" + std::to_string(comm.rank()) + ".json"));
  });
  expect_no_errors(errors);
  for (int r = 1; r < kWorld; ++r) EXPECT_FALSE(fs::exists(tmp.file("trace" + std::to_string(r) + ".json"))) << r;
  ASSERT_TRUE(fs::exists(tmp.file("trace0.json")));
  for (const auto& t : times) ASSERT_EQ(t.passes.size(), static_cast<size_t>(2 * m));

  const auto trace = nlohmann::json::parse(read_text(tmp.file("trace0.json")));
  std::map<int, std::string> tracks;
  std::map<int, std::vector<nlohmann::json>> spans;
  std::string process;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name")
      tracks[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    if (e["ph"] == "M" && e["name"] == "process_name") process = e["args"]["name"].get<std::string>();
    if (e["ph"] == "X") spans[e["tid"].get<int>()].push_back(e);
  }
  EXPECT_EQ(process, "tandem pipeline, step 7");
  EXPECT_EQ(tracks, (std::map<int, std::string>{{0, "stage 0: Blocks 0 .. 1 (embed .. layer.0)"},
                                                {1, "stage 1: Blocks 2 .. 3 (layer.1 .. head)"}}));
  const std::vector<std::vector<std::string>> names = {{"F0", "F1", "B0", "F2", "B1", "B2"},
                                                       {"F0", "B0", "F1", "B1", "F2", "B2"}};
  const double origin = std::min(times[0].passes[0].first, times[2].passes[0].first);
  double earliest = 1e300;
  for (int s = 0; s < kStages; ++s) {
    const auto& mine = times[static_cast<size_t>(2 * s)].passes;  // the stage's first replica: rank 2s
    ASSERT_EQ(spans[s].size(), static_cast<size_t>(2 * m)) << "stage " << s;
    for (size_t i = 0; i < spans[s].size(); ++i) {
      const auto& e = spans[s][i];
      SCOPED_TRACE("stage " + std::to_string(s) + ", span " + std::to_string(i));
      EXPECT_EQ(e["name"].get<std::string>(), names[static_cast<size_t>(s)][i]);
      EXPECT_EQ(e["cat"].get<std::string>(), "step 7");
      EXPECT_EQ(e["args"]["step"].get<int64_t>(), 7);
      const double t0 = (mine[i].first - origin) * 1e6, t1 = (mine[i].second - origin) * 1e6;
      EXPECT_NEAR(e["ts"].get<double>(), t0, 0.002);
      EXPECT_NEAR(e["dur"].get<double>(), t1 - t0, 0.002);
      earliest = std::min(earliest, e["ts"].get<double>());
    }
  }
  EXPECT_NEAR(earliest, 0.0, 0.001) << "times count from the step's earliest pass";
}

// The trace is a by-product: a path that cannot be written costs a warning, not the run.
TEST(PipelineTrace, AFileThatCannotBeWrittenIsNotAnError) {
  TempDir tmp;
  std::ofstream(tmp.file("plain-file")) << "x";
  const std::string path = tmp.file("plain-file") + "/trace.json";  // under a file: no directory can be made
  const auto errors = on_ranks(2, 2, port(11), [&](Comm& comm) {
    StageFixture stage(comm, 2, PipelineSchedule::kGPipe);
    stage.run_step(2);
    write_pipeline_trace(comm, stage.parts, *stage.model, 1, 2, path);
  });
  expect_no_errors(errors);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(read_text(tmp.file("plain-file")), "x");
}

}  // namespace
}  // namespace tandem::test
