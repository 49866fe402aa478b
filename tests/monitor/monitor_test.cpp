// Telemetry sources without a GPU: NVML absent, /proc and RAPL read from fake trees (utilisation
// deltas, memory, the energy counter's wrap, unreadable RAPL), the sampler thread, and a training
// run's metrics and summary carrying the telemetry.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../test_util.h"
#include "tandem/monitor/host_stats.h"
#include "tandem/monitor/nvml.h"
#include "tandem/monitor/sampler.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// A /proc with two cores; `busy` and `idle` jiffies per core, `ticks` of this process.
void fake_proc(const std::string& root, uint64_t busy0, uint64_t idle0, uint64_t busy1, uint64_t idle1,
               uint64_t ticks) {
  const auto line = [](const char* tag, uint64_t busy, uint64_t idle) {
    // user nice system idle iowait irq softirq steal: busy split over user and system.
    return std::string(tag) + " " + std::to_string(busy / 2) + " 0 " + std::to_string(busy - busy / 2) + " " +
           std::to_string(idle) + " 0 0 0 0 0 0\n";
  };
  write(root + "/stat", line("cpu ", busy0 + busy1, idle0 + idle1) + line("cpu0", busy0, idle0) +
                            line("cpu1", busy1, idle1) + "intr 1 2 3\n");
  // pid (comm with) spaces) state ppid ... utime is field 14, stime 15.
  write(root + "/self/stat", "42 (tandem x) S 1 1 1 0 -1 0 0 0 0 0 " + std::to_string(ticks) + " 0 0 0 20 0\n");
  write(root + "/meminfo", "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n");
  write(root + "/self/status", "Name:\ttandem\nVmRSS:\t     300 kB\n");
}

TEST(Telemetry, AbsentNvmlIsOneLineNotAFailure) {
  std::string why;
  EXPECT_EQ(Nvml::open(&why, "libnvidia-ml-does-not-exist.so.9"), nullptr);
  EXPECT_NE(why.find("not loadable"), std::string::npos) << why;
  EXPECT_NE(why.find("no GPU telemetry"), std::string::npos) << why;
}

TEST(Telemetry, ProcUtilisationAndMemoryFromDeltas) {
  test::TempDir dir;
  const std::string proc = dir.file("proc");
  fake_proc(proc, 100, 900, 500, 500, 10);
  HostMonitor h(proc, dir.file("no-powercap"));
  const auto first = h.read();
  EXPECT_FALSE(first.cpu_pct.has_value());  // no previous reading yet
  EXPECT_EQ(first.mem_total_bytes.value(), 1000 * 1024);
  EXPECT_EQ(first.mem_used_bytes.value(), 750 * 1024);
  EXPECT_EQ(first.process_rss_bytes.value(), 300 * 1024);
  EXPECT_FALSE(first.cpu_energy_j.has_value());
  EXPECT_NE(h.energy_unavailable().find("no RAPL"), std::string::npos);
  // Core 0: +30 busy of +100; core 1: +100 busy of +100.
  fake_proc(proc, 130, 970, 600, 500, 20);
  const auto second = h.read();
  ASSERT_TRUE(second.cpu_pct.has_value());
  EXPECT_NEAR(*second.cpu_pct, 65.0, 1e-9);
  ASSERT_EQ(second.core_pct.size(), 2u);
  EXPECT_NEAR(second.core_pct[0], 30.0, 1e-9);
  EXPECT_NEAR(second.core_pct[1], 100.0, 1e-9);
  ASSERT_TRUE(second.process_cpu_pct.has_value());
  EXPECT_GT(*second.process_cpu_pct, 0.0);  // 10 ticks over the (short) time between reads
}

TEST(Telemetry, RaplPackagesSummedAcrossTheCounterWrap) {
  test::TempDir dir;
  const std::string cap = dir.file("powercap");
  write(cap + "/intel-rapl:0/energy_uj", "999000000\n");
  write(cap + "/intel-rapl:0/max_energy_range_uj", "1000000000\n");
  write(cap + "/intel-rapl:1/energy_uj", "5000000\n");
  write(cap + "/intel-rapl:1/max_energy_range_uj", "1000000000\n");
  write(cap + "/intel-rapl:0:0/energy_uj", "123\n");  // a sub-domain: not counted
  HostMonitor h(dir.file("proc"), cap);
  EXPECT_TRUE(h.energy_unavailable().empty()) << h.energy_unavailable();
  EXPECT_NEAR(h.cpu_energy_j().value(), 0.0, 1e-12);
  // Package 0 wraps: 999 J -> 1000 J (the range) -> 2 J, i.e. +3 J; package 1: +1.5 J.
  write(cap + "/intel-rapl:0/energy_uj", "2000000\n");
  write(cap + "/intel-rapl:1/energy_uj", "6500000\n");
  EXPECT_NEAR(h.cpu_energy_j().value(), 4.5, 1e-9);
  write(cap + "/intel-rapl:0/energy_uj", "3000000\n");
  EXPECT_NEAR(h.cpu_energy_j().value(), 5.5, 1e-9);

  // Root-only counters: no energy, and the reason names the file.
  test::TempDir locked;
  fs::create_directories(locked.file("powercap/intel-rapl:0"));
  HostMonitor none(locked.file("proc"), locked.file("powercap"));
  EXPECT_FALSE(none.cpu_energy_j().has_value());
  EXPECT_NE(none.energy_unavailable().find("energy_uj is not readable"), std::string::npos)
      << none.energy_unavailable();
}

TEST(Telemetry, SamplerWithoutAGpuSamplesTheHostAndSaysWhatIsMissing) {
  test::TempDir dir;
  SamplerOptions o;
  o.period_s = 0.01;
  o.cuda_devices = {0};
  o.nvml_library = "libnvidia-ml-does-not-exist.so.9";
  o.powercap_root = dir.file("none");
  o.history = 5;
  Sampler s(o);
  ASSERT_EQ(s.why_missing().size(), 2u);
  EXPECT_NE(s.why_missing()[0].find("no GPU telemetry"), std::string::npos);
  EXPECT_NE(s.why_missing()[1].find("no CPU energy"), std::string::npos);
  EXPECT_FALSE(s.has_gpu());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.samples() < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(s.samples(), 8);
  const auto last = s.latest();
  EXPECT_TRUE(last.gpus.empty());  // no NVML: no GPU readings at all
  EXPECT_TRUE(last.host.cpu_pct.has_value());
  EXPECT_TRUE(last.host.mem_total_bytes.has_value());
  EXPECT_LE(s.since(0.0).size(), 5u);  // the history is bounded
  EXPECT_FALSE(s.energy_now().gpu_j.has_value());
  EXPECT_GE(s.thread_cpu_s(), 0.0);
}

TEST(Telemetry, TrainingRunWritesTelemetryToMetricsAndSummary) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 12);
  c.monitor.period_s = 0.01;
  train(c, {});
  std::ifstream in(dir.file("metrics.jsonl"));
  std::string line;
  int with_cpu = 0, rows = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++rows;
    with_cpu += j.contains("cpu_util_pct") && j.contains("host_mem_used_bytes");
    EXPECT_FALSE(j.contains("gpu_power_w"));  // the CPU device: no GPU fields
  }
  EXPECT_EQ(rows, 12);
  EXPECT_GT(with_cpu, 0);
  std::ifstream sj(dir.file("summary.json"));
  const auto summary = nlohmann::json::parse(sj);
  ASSERT_TRUE(summary.contains("telemetry"));
  EXPECT_GT(summary["telemetry"]["samples"].get<int64_t>(), 0);
  EXPECT_LT(summary["telemetry"]["sampler_cpu_fraction"].get<double>(), 0.5);

  // Off: no sampler, no telemetry keys.
  test::TempDir off;
  Config d = test::tiny_cpu_config(off.path(), 3);
  d.monitor.enabled = false;
  train(d, {});
  std::ifstream in2(off.file("metrics.jsonl"));
  while (std::getline(in2, line)) EXPECT_EQ(line.find("cpu_util_pct"), std::string::npos);
}

}  // namespace
}  // namespace tandem
