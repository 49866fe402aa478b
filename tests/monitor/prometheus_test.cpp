// The Prometheus text format (monitor/prometheus.h): label escaping, how samples carry the base
// labels, and a run's /metrics body from its feed: the latest step row, telemetry in base units,
// energy counters summed over the steps, each family declared once before its samples.

#include "tandem/monitor/prometheus.h"

#include <gtest/gtest.h>

#include <limits>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/monitor/run_feed.h"

namespace tandem {
namespace {

using json = nlohmann::json;

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l == line) return true;
  return false;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// A feed with every key the body reads.
void fill(RunFeed& feed) {
  feed.add_row({{"step", 1}, {"loss", 3.5}, {"tokens", 512}, {"energy_gpu_j", 10.0}, {"energy_cpu_j", 2.0}});
  feed.add_row({{"step", 2},
                {"loss", 3.25},
                {"tokens", 1024},
                {"lr", 0.001},
                {"grad_norm", 0.75},
                {"step_time_s", 0.5},
                {"tokens_per_s", 1024.0},
                {"loss_scale", 65536.0},
                {"offload_k", 0.25},
                {"offload_gpu_blocks", 3},
                {"offload_rollbacks", 1},
                {"time_forward_s", 0.125},
                {"time_backward_s", 0.25},
                {"time_update_s", 0.0625},
                {"time_idle_s", 0.0},
                {"time_transfer_s", 0.375},
                {"time_cpu_update_s", 0.3},
                {"mem_device_bytes", 1 << 30},
                {"mem_device_reserved_bytes", 2 << 20},
                {"mem_host_peak_bytes", 3 << 20},
                {"energy_gpu_j", 5.5},
                {"energy_cpu_j", 1.0},
                {"energy_gpu_j_per_token", 0.01},
                {"energy_cpu_j_per_token", 0.002}});
  feed.add_row({{"step", 2}, {"eval_loss", 3.0}});
  feed.add_sample({{"t_s", 1.0},
                   {"gpu_util_pct", 97.0},
                   {"gpu_mem_util_pct", 40.0},
                   {"gpu_mem_used_bytes", 70LL << 30},
                   {"gpu_mem_total_bytes", 80LL << 30},
                   {"gpu_temp_c", 61.0},
                   {"gpu_power_w", 640.5},
                   {"gpu_sm_clock_mhz", 1980.0},
                   {"cpu_util_pct", 35.0},
                   {"cpu_core_pct", {10.0, 60.0, 5.0}},
                   {"cpu_process_pct", 150.0},
                   {"host_mem_used_bytes", 90LL << 30},
                   {"host_mem_total_bytes", 128LL << 30},
                   {"host_rss_bytes", 40LL << 30}});
}

TEST(Prometheus, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(prometheus_label("plain value"), "plain value");
  EXPECT_EQ(prometheus_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(prometheus_label(""), "");
  EXPECT_EQ(prometheus_label("tab\tstays"), "tab\tstays");
}

TEST(Prometheus, SamplesCarryTheBaseLabelsThenTheirOwn) {
  PrometheusText with_base("run=\"x\"");
  with_base.family("tandem_requests_total", "counter", "Requests answered.");
  with_base.sample("tandem_requests_total", 3);
  with_base.sample("tandem_requests_total", 4, "status=\"200\"");
  EXPECT_EQ(with_base.str(),
            "# HELP tandem_requests_total Requests answered.\n"
            "# TYPE tandem_requests_total counter\n"
            "tandem_requests_total{run=\"x\"} 3\n"
            "tandem_requests_total{run=\"x\",status=\"200\"} 4\n");
  PrometheusText bare;
  bare.metric("tandem_queue_depth", "gauge", "Waiting requests.", 0);
  bare.sample("tandem_queue_depth", 2, "route=\"/v1\"");
  EXPECT_EQ(bare.str(),
            "# HELP tandem_queue_depth Waiting requests.\n"
            "# TYPE tandem_queue_depth gauge\n"
            "tandem_queue_depth 0\n"
            "tandem_queue_depth{route=\"/v1\"} 2\n");
}

TEST(Prometheus, ValuesKeepFifteenSignificantDigits) {
  const auto value_of = [](double v) {
    PrometheusText e;
    e.sample("m", v);
    return e.str();
  };
  EXPECT_EQ(value_of(0.1), "m 0.1\n");
  EXPECT_EQ(value_of(123456789012.0), "m 123456789012\n");
  EXPECT_EQ(value_of(2.0 / 3.0), "m 0.666666666666667\n");
  EXPECT_EQ(value_of(1e-7), "m 1e-07\n");
  EXPECT_EQ(value_of(-2.5), "m -2.5\n");
}

TEST(Prometheus, AnEmptyFeedIsUpAndNothingElseUntilItFinishes) {
  RunFeed feed;
  const std::string help =
      "# HELP tandem_up 1 while the run is training, 0 once it has finished.\n"
      "# TYPE tandem_up gauge\n";
  EXPECT_EQ(prometheus_text(feed, ""), help + "tandem_up 1\n");
  EXPECT_EQ(prometheus_text(feed, "r1"), help + "tandem_up{run=\"r1\"} 1\n");
  feed.finish();
  EXPECT_EQ(prometheus_text(feed, ""), help + "tandem_up 0\n");
}

TEST(Prometheus, TheLatestStepRowGivesCountersAndGauges) {
  RunFeed feed;
  fill(feed);
  const std::string text = prometheus_text(feed, "");
  for (const char* line : {"# TYPE tandem_steps_total counter",
                           "tandem_steps_total 2",
                           "# TYPE tandem_tokens_total counter",
                           "tandem_tokens_total 1024",
                           "# TYPE tandem_loss gauge",
                           "tandem_loss 3.25",
                           "tandem_eval_loss 3",
                           "tandem_learning_rate 0.001",
                           "tandem_grad_norm 0.75",
                           "tandem_step_duration_seconds 0.5",
                           "tandem_tokens_per_second 1024",
                           "tandem_loss_scale 65536",
                           "tandem_offload_update_split_ratio 0.25",
                           "tandem_offload_gpu_blocks 3",
                           "tandem_offload_rollbacks_total 1",
                           "tandem_step_phase_seconds{phase=\"forward\"} 0.125",
                           "tandem_step_phase_seconds{phase=\"idle\"} 0",
                           "tandem_step_phase_seconds{phase=\"cpu_update\"} 0.3",
                           "tandem_device_memory_allocated_bytes 1073741824",
                           "tandem_device_memory_reserved_bytes 2097152",
                           "tandem_process_resident_peak_bytes 3145728",
                           "tandem_cpu_energy_joules_per_token 0.002",
                           "tandem_gpu_energy_joules_per_token{gpu=\"0\"} 0.01"})
    EXPECT_TRUE(has_line(text, line)) << "missing: " << line << "\n" << text;
  EXPECT_FALSE(has_line(text, "tandem_loss 3.5")) << "only the latest step row";
  // The phases in their fixed order.
  std::vector<std::string> phases;
  for (const auto& l : lines_of(text))
    if (l.rfind("tandem_step_phase_seconds{", 0) == 0)
      phases.push_back(l.substr(l.find('"') + 1, l.rfind('"') - l.find('"') - 1));
  EXPECT_EQ(phases, (std::vector<std::string>{"forward", "backward", "update", "idle", "transfer", "cpu_update"}));
}

TEST(Prometheus, AbsentOrNonNumericKeysLeaveTheirFamiliesOut) {
  RunFeed feed;
  feed.add_row({{"step", 1}, {"loss", "diverged"}, {"lr", nullptr}, {"time_update_s", 0.5}});
  feed.add_sample({{"gpu_temp_c", "hot"}, {"cpu_core_pct", json::array()}});
  const std::string text = prometheus_text(feed, "");
  EXPECT_TRUE(has_line(text, "tandem_steps_total 1")) << text;
  EXPECT_TRUE(has_line(text, "tandem_step_phase_seconds{phase=\"update\"} 0.5")) << text;
  for (const char* family : {"tandem_loss", "tandem_learning_rate", "tandem_tokens_total", "tandem_eval_loss",
                             "tandem_gpu_temperature_celsius", "tandem_cpu_core_utilization_ratio",
                             "tandem_gpu_energy_joules_total", "tandem_cpu_energy_joules_total", "tandem_loss_scale"})
    EXPECT_EQ(text.find(std::string("# TYPE ") + family + " "), std::string::npos) << family << "\n" << text;
}

TEST(Prometheus, NullCountersAndNonFiniteGaugesNeverBreakTheScrape) {
  RunFeed feed;  // a followed metrics.jsonl writes NaN as null
  feed.add_row({{"step", nullptr},
                {"tokens", "x"},
                {"offload_rollbacks", nullptr},
                {"loss", std::numeric_limits<double>::quiet_NaN()},
                {"grad_norm", std::numeric_limits<double>::infinity()}});
  feed.add_sample({{"cpu_core_pct", json::array({50.0, nullptr, 25.0})}});
  const std::string text = prometheus_text(feed, "");
  EXPECT_EQ(text.find("tandem_steps_total"), std::string::npos) << text;
  EXPECT_EQ(text.find("tandem_offload_rollbacks_total"), std::string::npos) << text;
  EXPECT_TRUE(has_line(text, "tandem_loss NaN")) << text;
  EXPECT_TRUE(has_line(text, "tandem_grad_norm +Inf")) << text;
  EXPECT_TRUE(has_line(text, "tandem_cpu_core_utilization_ratio{core=\"2\"} 0.25")) << text;
  EXPECT_EQ(text.find("core=\"1\""), std::string::npos) << text;
}

TEST(Prometheus, TelemetryIsScaledToBaseUnits) {
  RunFeed feed;
  fill(feed);
  const std::string text = prometheus_text(feed, "");
  for (const char* line :
       {"tandem_gpu_utilization_ratio{gpu=\"0\"} 0.97", "tandem_gpu_memory_bus_utilization_ratio{gpu=\"0\"} 0.4",
        "tandem_gpu_memory_used_bytes{gpu=\"0\"} 75161927680", "tandem_gpu_memory_total_bytes{gpu=\"0\"} 85899345920",
        "tandem_gpu_temperature_celsius{gpu=\"0\"} 61", "tandem_gpu_power_watts{gpu=\"0\"} 640.5",
        "tandem_gpu_sm_clock_hertz{gpu=\"0\"} 1980000000", "tandem_cpu_utilization_ratio 0.35",
        "tandem_cpu_core_utilization_ratio{core=\"0\"} 0.1", "tandem_cpu_core_utilization_ratio{core=\"1\"} 0.6",
        "tandem_cpu_core_utilization_ratio{core=\"2\"} 0.05", "tandem_process_cpu_cores 1.5",
        "tandem_host_memory_used_bytes 96636764160", "tandem_host_memory_total_bytes 137438953472",
        "tandem_process_resident_bytes 42949672960"})
    EXPECT_TRUE(has_line(text, line)) << "missing: " << line << "\n" << text;
}

TEST(Prometheus, EnergyCountersSumEveryStepRow) {
  RunFeed feed;
  fill(feed);
  const std::string text = prometheus_text(feed, "");
  EXPECT_TRUE(has_line(text, "# TYPE tandem_gpu_energy_joules_total counter")) << text;
  EXPECT_TRUE(has_line(text, "tandem_gpu_energy_joules_total{gpu=\"0\"} 15.5")) << text;
  EXPECT_TRUE(has_line(text, "tandem_cpu_energy_joules_total 3")) << text;
}

// What `promtool check metrics` insists on, checked without it: one HELP and TYPE per family,
// before its samples; counters end in _total; every sample carries the run label.
TEST(Prometheus, EachFamilyIsDeclaredOnceBeforeItsSamples) {
  RunFeed feed;
  fill(feed);
  const std::string text = prometheus_text(feed, "run \"7\"");
  std::map<std::string, std::string> type_of;
  std::map<std::string, int> help_count;
  std::string previous;
  int samples = 0;
  for (const auto& l : lines_of(text)) {
    if (l.rfind("# HELP ", 0) == 0) {
      const std::string name = l.substr(7, l.find(' ', 7) - 7);
      ++help_count[name];
    } else if (l.rfind("# TYPE ", 0) == 0) {
      const std::string name = l.substr(7, l.find(' ', 7) - 7);
      const std::string type = l.substr(l.find(' ', 7) + 1);
      EXPECT_EQ(type_of.count(name), 0u) << "declared twice: " << name;
      EXPECT_EQ(previous.rfind("# HELP " + name + " ", 0), 0u) << "HELP right before TYPE: " << name;
      EXPECT_TRUE(type == "gauge" || type == "counter") << l;
      EXPECT_EQ(type == "counter", name.size() > 6 && name.substr(name.size() - 6) == "_total") << l;
      type_of[name] = type;
    } else {
      ++samples;
      const std::string name = l.substr(0, l.find_first_of("{ "));
      EXPECT_EQ(type_of.count(name), 1u) << "a sample before its TYPE: " << l;
      EXPECT_EQ(l.rfind(name + "{run=\"run \\\"7\\\"\"", 0), 0u) << "the run label first: " << l;
    }
    previous = l;
  }
  for (const auto& [name, n] : help_count) EXPECT_EQ(n, 1) << name;
  EXPECT_EQ(help_count.size(), type_of.size());
  EXPECT_GT(samples, 0);
}

}  // namespace
}  // namespace tandem
