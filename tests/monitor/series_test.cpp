// The chart list shared by the dashboard and `tandem report` (monitor/series.h): its JSON form for
// the page, and that every series names a key the run actually writes: the sampler's telemetry
// (live and, through RunFeed::follow, in a finished run) and the step phases /metrics exports.

#include "tandem/monitor/series.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../test_util.h"
#include "tandem/monitor/prometheus.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/sampler.h"

namespace tandem {
namespace {

using json = nlohmann::json;

const ChartSpec& chart(const std::string& id) {
  for (const auto& c : chart_specs())
    if (c.id == id) return c;
  ADD_FAILURE() << "no chart '" << id << "'";
  static const ChartSpec none;
  return none;
}

// A telemetry sample with every reading present.
TelemetrySample full_sample() {
  TelemetrySample s;
  s.t = 2.5;
  GpuReading g;
  g.util_pct = 90, g.mem_util_pct = 30, g.mem_used_bytes = 1 << 30, g.mem_total_bytes = int64_t{80} << 30;
  g.temp_c = 60, g.power_w = 500, g.energy_j = 1e6, g.sm_clock_mhz = 1980;
  s.gpus = {g, g};
  s.host.cpu_pct = 20, s.host.core_pct = {10, 30}, s.host.process_cpu_pct = 120;
  s.host.mem_used_bytes = int64_t{10} << 30, s.host.mem_total_bytes = int64_t{64} << 30;
  s.host.process_rss_bytes = int64_t{3} << 30, s.host.cpu_energy_j = 100;
  return s;
}

TEST(Series, TheDashboardJsonIsTheChartList) {
  const auto& specs = chart_specs();
  const json j = chart_specs_json();
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), specs.size());
  ASSERT_FALSE(specs.empty());
  for (size_t i = 0; i < specs.size(); ++i) {
    const ChartSpec& c = specs[i];
    const json& e = j[i];
    EXPECT_EQ(e["id"], c.id);
    EXPECT_EQ(e["title"], c.title);
    EXPECT_EQ(e["unit"], c.unit);
    EXPECT_EQ(e["axis"], c.axis == ChartSpec::Axis::kSteps ? "step" : "t_s") << c.id;
    EXPECT_DOUBLE_EQ(e["scale"].get<double>(), c.scale) << c.id;
    EXPECT_EQ(e["stacked"], c.stacked) << c.id;
    ASSERT_EQ(e["series"].size(), c.series.size()) << c.id;
    for (size_t k = 0; k < c.series.size(); ++k) {
      EXPECT_EQ(e["series"][k]["key"], c.series[k].key);
      EXPECT_EQ(e["series"][k]["label"], c.series[k].label);
      EXPECT_EQ(e["series"][k]["overlay"], c.series[k].overlay) << c.id << "/" << c.series[k].key;
    }
  }
  EXPECT_EQ(chart_specs_json(), j) << "the same list every time";
}

TEST(Series, ChartIdsAndEachChartsKeysAreUniqueAndNothingIsEmpty) {
  std::set<std::string> ids;
  for (const auto& c : chart_specs()) {
    EXPECT_TRUE(ids.insert(c.id).second) << "two charts named " << c.id;
    EXPECT_FALSE(c.title.empty()) << c.id;
    EXPECT_FALSE(c.series.empty()) << c.id;
    EXPECT_GT(c.scale, 0) << c.id;
    std::set<std::string> keys;
    bool stacked_part = false;
    for (const auto& s : c.series) {
      EXPECT_TRUE(keys.insert(s.key).second) << c.id << " repeats " << s.key;
      EXPECT_FALSE(s.label.empty()) << c.id << "/" << s.key;
      stacked_part |= !s.overlay;
    }
    if (c.stacked) {
      EXPECT_TRUE(stacked_part) << c.id << " is stacked but every series is an overlay";
    }
  }
}

TEST(Series, TimeChartsReadKeysTheSamplerWrites) {
  const json sample = telemetry_json(full_sample());
  int time_series = 0;
  for (const auto& c : chart_specs()) {
    if (c.axis != ChartSpec::Axis::kTime) continue;
    for (const auto& s : c.series) {
      ++time_series;
      EXPECT_TRUE(sample.contains(s.key) && sample[s.key].is_number()) << c.id << "/" << s.key << " in " << sample;
    }
  }
  EXPECT_GT(time_series, 0);
}

// A finished run has no live samples: RunFeed::follow rebuilds them from the step rows' keys with
// the telemetry prefixes, so every time chart's key must carry one of them.
TEST(Series, AFinishedRunKeepsEveryTimeChartsKey) {
  test::TempDir dir;
  json row = telemetry_json(full_sample());
  row["step"] = 1;
  row["loss"] = 2.0;
  row["t_s"] = 4.0;
  std::ofstream(dir.file("metrics.jsonl")) << row.dump() << "\n";
  RunFeed feed;
  feed.follow(dir.file("metrics.jsonl"));
  const json sample = feed.latest_sample();
  for (const auto& c : chart_specs()) {
    if (c.axis != ChartSpec::Axis::kTime) continue;
    for (const auto& s : c.series) EXPECT_TRUE(sample.contains(s.key)) << c.id << "/" << s.key << " in " << sample;
  }
}

TEST(Series, TheStepTimeSplitIsThePhasesMetricsExports) {
  const ChartSpec& split = chart("time_split");
  EXPECT_TRUE(split.stacked);
  EXPECT_EQ(split.axis, ChartSpec::Axis::kSteps);
  for (const auto& s : split.series) {
    ASSERT_EQ(s.key.rfind("time_", 0), 0u) << s.key;
    ASSERT_EQ(s.key.substr(s.key.size() - 2), "_s") << s.key;
    const std::string phase = s.key.substr(5, s.key.size() - 7);
    RunFeed feed;
    feed.add_row({{"step", 1}, {"loss", 1.0}, {s.key, 0.5}});
    const std::string text = prometheus_text(feed, "");
    EXPECT_NE(text.find("tandem_step_phase_seconds{phase=\"" + phase + "\"} 0.5\n"), std::string::npos)
        << s.key << " is charted but not exported\n"
        << text;
  }
}

TEST(Series, MemoryIsShownInGibibytes) {
  const ChartSpec& memory = chart("memory");
  EXPECT_EQ(memory.unit, "GiB");
  EXPECT_DOUBLE_EQ(memory.scale * 1024.0 * 1024.0 * 1024.0, 1.0);
  for (const auto& s : memory.series) EXPECT_NE(s.key.find("bytes"), std::string::npos) << s.key;
}

}  // namespace
}  // namespace tandem
