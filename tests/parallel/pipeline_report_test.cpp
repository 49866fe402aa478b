// A pipeline run's step report (parallel/pipeline_report.h): each stage's first replica's times and
// the bubble in every rank's row, rank 0's one log line, the trace on listed steps, a bad step list
// refused. Ranks are threads on loopback Gloo.

#include "tandem/parallel/pipeline_report.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "../test_util.h"
#include "comm_threads.h"
#include "stage_fixture.h"
#include "tandem/core/config.h"
#include "tandem/sched/pipeline_schedule.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string fixed3(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

// 2 stages x 2 replicas, 3 micro-batches: the stages' numbers are ranks 0's and 2's (not their
// replicas', ranks 1 and 3), the same in every rank's row.
TEST(PipelineReport, EveryRowHoldsEachStagesFirstReplicaAndTheBubble) {
  constexpr int kWorld = 4, kStages = 2;
  constexpr int64_t m = 3;
  TempDir tmp;
  Config cfg;
  cfg.train.grad_accum = m;
  cfg.dist.pipeline_trace_steps = "2";
  std::vector<StageTimes> times(kWorld);
  std::vector<std::map<int64_t, nlohmann::json>> rows(kWorld);
  std::map<int64_t, bool> traced;  // rank 0: the trace file after each step
  testing::internal::CaptureStderr();
  const auto errors = on_ranks(kWorld, kStages, port(10), [&](Comm& comm) {
    const int rank = comm.rank();
    const std::string dir = tmp.file("r" + std::to_string(rank));
    fs::create_directories(dir);
    StageFixture stage(comm, kStages, PipelineSchedule::k1F1B);
    stage.parts.predicted_step_s = 1.5;
    times[static_cast<size_t>(rank)] = stage.run_step(m);
    PipelineReport report(stage.parts, *stage.model, cfg, dir);
    for (int64_t step = 1; step <= 5; ++step) {
      nlohmann::json row = {{"step", step}};
      report.add_step(comm, step, /*steps_run=*/step, /*step_s=*/0.5, row);
      rows[static_cast<size_t>(rank)][step] = row;
      if (rank == 0) traced[step] = fs::exists(dir + "/pipeline_trace.json");
    }
    // Without a prediction the line gives the measured step alone.
    stage.parts.predicted_step_s = 0;
    PipelineReport unpredicted(stage.parts, *stage.model, cfg, dir);
    nlohmann::json row;
    unpredicted.add_step(comm, 9, 4, 0.25, row);
  });
  const std::string log = testing::internal::GetCapturedStderr();
  expect_no_errors(errors);

  const double b0 = times[0].section_s - times[0].wait_s, b1 = times[2].section_s - times[2].wait_s;
  EXPECT_GT(b0, 0.0);
  EXPECT_GT(b1, 0.0);
  const double span = std::max(times[0].section_s, times[2].section_s);
  const double bubble = 1.0 - (b0 + b1) / 2.0 / span;
  for (int r = 0; r < kWorld; ++r) {
    for (const auto& [step, row] : rows[static_cast<size_t>(r)]) {
      SCOPED_TRACE("rank " + std::to_string(r) + ", step " + std::to_string(step));
      const auto busy = row.at("pipeline_stage_busy_s").get<std::vector<double>>();
      const auto wait = row.at("pipeline_stage_wait_s").get<std::vector<double>>();
      ASSERT_EQ(busy.size(), 2u);
      ASSERT_EQ(wait.size(), 2u);
      EXPECT_DOUBLE_EQ(busy[0], b0);
      EXPECT_DOUBLE_EQ(busy[1], b1);
      EXPECT_DOUBLE_EQ(wait[0], times[0].wait_s);
      EXPECT_DOUBLE_EQ(wait[1], times[2].wait_s);
      EXPECT_DOUBLE_EQ(row.at("pipeline_bubble").get<double>(), bubble);
      EXPECT_DOUBLE_EQ(row.at("pipeline_bubble_ideal").get<double>(), 0.25);  // (p-1)/(m+p-1) = 1/4
      EXPECT_DOUBLE_EQ(row.at("pipeline_bubble_schedule").get<double>(), pipeline_bubble(busy, m));
      EXPECT_EQ(row.at("step").get<int64_t>(), step) << "the row's own keys stay";
    }
  }
  EXPECT_EQ(traced, (std::map<int64_t, bool>{{1, false}, {2, true}, {3, true}, {4, true}, {5, true}}));
  for (int r = 1; r < kWorld; ++r) EXPECT_FALSE(fs::exists(tmp.file("r" + std::to_string(r) + "/pipeline_trace.json")));

  EXPECT_EQ(count_of(log, "pipeline: step "), 2u) << log;  // once per report, on rank 0 alone
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.1f%%", 100 * bubble);
  const std::string stages =
      " | stages busy " + fixed3(b0) + " " + fixed3(b1) + " s | bubble " + percent + " (1F1B's (p-1)/(m+p-1): 25.0%)";
  EXPECT_NE(log.find("pipeline: step predicted 1.500 s, measured 0.500 s" + stages), std::string::npos) << log;
  EXPECT_NE(log.find("pipeline: step measured 0.250 s" + stages), std::string::npos) << log;
}

TEST(PipelineReport, ABadTraceStepListIsRefusedNamingTheKey) {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 16, s.n_head = 2, s.n_kv_head = 2, s.d_ff = 32, s.vocab_size = 64;
  const auto model = build_model(s, false);
  PipelineParts parts;
  Config cfg;
  TempDir tmp;
  for (const std::string bad : {"0", "2,x", "-3"}) {
    cfg.dist.pipeline_trace_steps = bad;
    EXPECT_NE(error_of([&] {
                PipelineReport(parts, *model, cfg, tmp.path());
              }).find("dist.pipeline_trace_steps takes step numbers >= 1"),
              std::string::npos)
        << bad;
  }
  cfg.dist.pipeline_trace_steps = "";  // no trace
  EXPECT_EQ(error_of([&] { PipelineReport(parts, *model, cfg, tmp.path()); }), "");
}

}  // namespace
}  // namespace tandem::test
