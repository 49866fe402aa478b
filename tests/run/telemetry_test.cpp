// What a run writes about itself: the step time split in metrics.jsonl and the trace's spans and
// counter tracks (Note [Step time split], Note [Offload trace]).

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

std::vector<nlohmann::json> step_rows(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) rows.push_back(j);
  }
  return rows;
}

TEST(Telemetry, StepRowsCarryATimeSplitThatAddsUpToTheStep) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 8);
  c.offload.optimizer = OffloadTarget::kCpu;
  c.train.grad_accum = 2;
  train(c, {});
  const auto rows = step_rows(dir.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), 8u);
  for (const auto& r : rows) {
    for (const char* k : {"time_forward_s", "time_backward_s", "time_update_s", "time_idle_s", "time_transfer_s",
                          "time_cpu_update_s", "t_s"}) {
      ASSERT_TRUE(r.contains(k)) << k << " missing in " << r.dump();
      EXPECT_GE(r[k].get<double>(), 0.0) << k;
    }
    const double parts = r["time_forward_s"].get<double>() + r["time_backward_s"].get<double>() +
                         r["time_update_s"].get<double>() + r["time_idle_s"].get<double>();
    EXPECT_NEAR(parts, r["step_time_s"].get<double>(), 1e-3 * r["step_time_s"].get<double>()) << r.dump();
    EXPECT_GT(r["time_forward_s"].get<double>(), 0.0);
    EXPECT_GT(r["time_backward_s"].get<double>(), 0.0);
  }
  // The CPU updates ran on the updater thread. A row counts the updater's time up to the row's
  // writing, so on a loaded machine one step's row can show none (its updates ran after it): the
  // steps after the first show some between them.
  double cpu_update = 0, transfer = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    cpu_update += rows[i]["time_cpu_update_s"].get<double>();
    transfer += rows[i]["time_transfer_s"].get<double>();
  }
  EXPECT_GT(cpu_update, 0.0);
  EXPECT_GT(transfer, 0.0);
}

// The run's last step, when traced, is written at the end (no next step begins to write it).
TEST(Telemetry, ATracedLastStepIsWritten) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 3);
  c.offload.optimizer = OffloadTarget::kCpu;
  c.offload.trace_steps = "3";
  train(c, {});
  const auto trace = nlohmann::json::parse(test::read_text(dir.file("trace.json")));
  EXPECT_FALSE(trace["traceEvents"].empty());
}

TEST(Telemetry, TraceEventsAreWellFormedAndCarryCounterTracks) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 6);
  c.offload.optimizer = OffloadTarget::kCpu;
  c.offload.trace_steps = "3,4";
  c.monitor.period_s = 0.02;
  train(c, {});
  const auto trace = nlohmann::json::parse(test::read_text(dir.file("trace.json")));
  ASSERT_TRUE(trace["traceEvents"].is_array());
  int spans = 0, counters = 0, meta = 0;
  for (const auto& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
    const std::string ph = e["ph"];
    if (ph == "X") {
      ++spans;
      for (const char* k : {"ts", "dur"}) ASSERT_TRUE(e.contains(k) && e[k].is_number()) << k << " in " << e.dump();
      ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      EXPECT_GE(e["ts"].get<double>(), 0.0);
    } else if (ph == "C") {
      ++counters;
      ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
      ASSERT_TRUE(e["args"].is_object() && !e["args"].empty()) << e.dump();
      for (auto it = e["args"].begin(); it != e["args"].end(); ++it) EXPECT_TRUE(it->is_number()) << e.dump();
    } else {
      ASSERT_EQ(ph, "M") << e.dump();
      ++meta;
      EXPECT_TRUE(e["args"].contains("name"));
    }
  }
  EXPECT_GT(spans, 0);
  EXPECT_GT(meta, 0);
  // No GPU here: the host's CPU utilisation and memory are the counter tracks.
  EXPECT_GT(counters, 0) << "no counter events in the trace";
}

}  // namespace
}  // namespace tandem
