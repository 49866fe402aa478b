// What a run reports: rows to metrics.jsonl (opened at the first row), TensorBoard groups, and
// summary.json with its schema version.
#include "tandem/run/run_metrics.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

TEST(RunMetrics, RowsGoToMetricsJsonlFromTheFirstRow) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 1);
  c.monitor.enabled = false;
  const RunContext ctx = open_run_context(c);
  const RunPlan plan = resolve_run_plan(c, {}, ctx);
  RunMetrics m(plan, ctx, "GPU-resident");
  EXPECT_FALSE(std::filesystem::exists(dir.file("metrics.jsonl"))) << "nothing written before the first row";
  m.publish({{"step", 1}, {"loss", 2.5}});
  m.publish({{"step", 1}, {"eval_loss", 2.25}});
  EXPECT_EQ(test::read_text(dir.file("metrics.jsonl")), "{\"loss\":2.5,\"step\":1}\n{\"eval_loss\":2.25,\"step\":1}\n");
  m.start();
  nlohmann::json row;
  const auto [gpu_j, cpu_j] = m.add_telemetry(row, 100);
  EXPECT_FALSE(gpu_j.has_value()) << "no sampler: no energy";
  EXPECT_TRUE(row.empty());
  TrainSummary s;
  s.final_step = 1;
  s.losses = {2.5};
  m.write_summary(s, plan, ctx, 100, 100, 1.0, nlohmann::json());
  const auto j = nlohmann::json::parse(test::read_text(dir.file("summary.json")));
  EXPECT_EQ(j.value("schema_version", 0), kSummarySchemaVersion);
  EXPECT_EQ(j.value("final_loss", 0.0), 2.5);
  EXPECT_FALSE(j.contains("placement"));
}

TEST(RunMetrics, TensorBoardScalarsAreGroupedByPrefix) {
  const auto scalars = tensorboard_scalars({{"step", 3}, {"loss", 1.0}, {"gpu_power_w", 300.0}, {"note", "x"}});
  ASSERT_EQ(scalars.size(), 2u);
  EXPECT_EQ(scalars[0].first, "gpu/gpu_power_w");
  EXPECT_EQ(scalars[1].first, "train/loss");
}

}  // namespace
}  // namespace tandem
