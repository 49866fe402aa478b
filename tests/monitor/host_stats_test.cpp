// Host telemetry from fake /proc and powercap trees (monitor/host_stats.h): iowait as idle, a core
// appearing between reads, this process's CPU over the interval, memory without MemAvailable, absent
// files, RAPL counters without a range, and one running energy total for read() and cpu_energy_j().
#include "tandem/monitor/host_stats.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "../test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// "cpu user nice system idle iowait irq softirq steal guest guest_nice"
std::string cpu_line(const std::string& tag, uint64_t user, uint64_t system, uint64_t idle, uint64_t iowait,
                     uint64_t irq = 0, uint64_t steal = 0) {
  return tag + " " + std::to_string(user) + " 0 " + std::to_string(system) + " " + std::to_string(idle) + " " +
         std::to_string(iowait) + " " + std::to_string(irq) + " 0 " + std::to_string(steal) + " 0 0\n";
}

void write_self_stat(const std::string& proc, uint64_t utime, uint64_t stime) {
  // Field 2 holds spaces and a ')' of its own: the fields are counted from the last ')'.
  write(proc + "/self/stat",
        "7 (a) b) c) R 1 1 1 0 -1 0 0 0 0 0 " + std::to_string(utime) + " " + std::to_string(stime) + " 0 0 20 0 1\n");
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

TEST(HostMonitor, IowaitCountsAsIdleAndIrqAndStealAsBusy) {
  test::TempDir dir;
  const std::string proc = dir.file("proc");
  write(proc + "/stat", cpu_line("cpu ", 100, 0, 1000, 0) + cpu_line("cpu0", 100, 0, 1000, 0));
  HostMonitor h(proc, dir.file("none"));
  h.read();
  // +10 user, +10 irq, +20 steal, +40 idle, +20 iowait: 40 of 100 busy.
  write(proc + "/stat", cpu_line("cpu ", 110, 0, 1040, 20, 10, 20) + cpu_line("cpu0", 110, 0, 1040, 20, 10, 20));
  const HostReading r = h.read();
  ASSERT_TRUE(r.cpu_pct.has_value());
  EXPECT_NEAR(*r.cpu_pct, 40.0, 1e-9);
  ASSERT_EQ(r.core_pct.size(), 1u);
  EXPECT_NEAR(r.core_pct[0], 40.0, 1e-9);
}

TEST(HostMonitor, NoTimeBetweenReadsIsZeroPercentNotADivisionByZero) {
  test::TempDir dir;
  const std::string proc = dir.file("proc");
  write(proc + "/stat", cpu_line("cpu ", 5, 5, 10, 0) + cpu_line("cpu0", 5, 5, 10, 0));
  HostMonitor h(proc, dir.file("none"));
  h.read();
  const HostReading r = h.read();  // the same counters again
  ASSERT_TRUE(r.cpu_pct.has_value());
  EXPECT_EQ(*r.cpu_pct, 0.0);
  ASSERT_EQ(r.core_pct.size(), 1u);
  EXPECT_EQ(r.core_pct[0], 0.0);
}

TEST(HostMonitor, ACoreThatAppearsBetweenReadsSkipsOneUtilisation) {
  test::TempDir dir;
  const std::string proc = dir.file("proc");
  write(proc + "/stat", cpu_line("cpu ", 10, 0, 90, 0) + cpu_line("cpu0", 10, 0, 90, 0));
  HostMonitor h(proc, dir.file("none"));
  h.read();
  write(proc + "/stat",
        cpu_line("cpu ", 60, 0, 140, 0) + cpu_line("cpu0", 35, 0, 65, 0) + cpu_line("cpu1", 25, 0, 75, 0));
  const HostReading changed = h.read();
  EXPECT_FALSE(changed.cpu_pct.has_value()) << "deltas across a different core count mean nothing";
  EXPECT_TRUE(changed.core_pct.empty());
  write(proc + "/stat",
        cpu_line("cpu ", 110, 0, 190, 0) + cpu_line("cpu0", 85, 0, 65, 0) + cpu_line("cpu1", 25, 0, 125, 0));
  const HostReading next = h.read();
  ASSERT_TRUE(next.cpu_pct.has_value());
  EXPECT_NEAR(*next.cpu_pct, 50.0, 1e-9);
  ASSERT_EQ(next.core_pct.size(), 2u);
  EXPECT_NEAR(next.core_pct[0], 100.0, 1e-9);
  EXPECT_NEAR(next.core_pct[1], 0.0, 1e-9);
}

TEST(HostMonitor, ProcessCpuIsItsTicksOverTheTimeBetweenReads) {
  test::TempDir dir;
  const std::string proc = dir.file("proc");
  write_self_stat(proc, 100, 50);
  HostMonitor h(proc, dir.file("none"));
  const auto t0 = Clock::now();
  const HostReading first = h.read();
  const auto t1 = Clock::now();
  EXPECT_FALSE(first.process_cpu_pct.has_value()) << "one read has no interval";
  const double hz = double(sysconf(_SC_CLK_TCK));
  // utime + stime grow by one second's worth of ticks.
  write_self_stat(proc, 100 + static_cast<uint64_t>(hz / 2), 50 + static_cast<uint64_t>(hz / 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t2 = Clock::now();
  const HostReading second = h.read();
  const auto t3 = Clock::now();
  ASSERT_TRUE(second.process_cpu_pct.has_value());
  const double ticks_s = double(2 * static_cast<uint64_t>(hz / 2)) / hz;
  // The monitor's interval lies between t2 - t1 and t3 - t0.
  EXPECT_GE(*second.process_cpu_pct, 100.0 * ticks_s / seconds(t0, t3) - 1e-9);
  EXPECT_LE(*second.process_cpu_pct, 100.0 * ticks_s / seconds(t1, t2) + 1e-9);
}

TEST(HostMonitor, MemoryWithoutMemAvailableHasATotalButNoUse) {
  test::TempDir dir;
  const std::string proc = dir.file("proc");
  write(proc + "/meminfo", "MemTotal:       2048 kB\nMemFree:        1024 kB\n");
  write(proc + "/self/status", "Name:\ttandem\nVmPeak:\t  999 kB\nVmRSS:\t     12 kB\nRssAnon:\t 5 kB\n");
  HostMonitor h(proc, dir.file("none"));
  const HostReading r = h.read();
  EXPECT_EQ(r.mem_total_bytes.value_or(-1), 2048 * 1024);
  EXPECT_FALSE(r.mem_used_bytes.has_value()) << "MemFree is not what is available";
  EXPECT_EQ(r.process_rss_bytes.value_or(-1), 12 * 1024) << "VmRSS, not VmPeak or RssAnon";
}

TEST(HostMonitor, AnEmptyTreeLeavesEveryFieldEmpty) {
  test::TempDir dir;
  HostMonitor h(dir.file("proc"), dir.file("powercap"));
  for (int i = 0; i < 2; ++i) {
    const HostReading r = h.read();
    EXPECT_FALSE(r.cpu_pct.has_value());
    EXPECT_TRUE(r.core_pct.empty());
    EXPECT_FALSE(r.process_cpu_pct.has_value());
    EXPECT_FALSE(r.mem_used_bytes.has_value());
    EXPECT_FALSE(r.mem_total_bytes.has_value());
    EXPECT_FALSE(r.process_rss_bytes.has_value());
    EXPECT_FALSE(r.cpu_energy_j.has_value());
  }
  EXPECT_NE(h.energy_unavailable().find(dir.file("powercap")), std::string::npos) << h.energy_unavailable();
}

TEST(HostMonitor, ACounterWithoutARangeAddsNothingWhenItGoesBack) {
  test::TempDir dir;
  const std::string cap = dir.file("powercap");
  write(cap + "/intel-rapl:0/energy_uj", "5000000\n");  // no max_energy_range_uj
  HostMonitor h(dir.file("proc"), cap);
  write(cap + "/intel-rapl:0/energy_uj", "7000000\n");
  EXPECT_NEAR(h.cpu_energy_j().value(), 2.0, 1e-9);
  write(cap + "/intel-rapl:0/energy_uj", "1000000\n");  // wrapped at an unknown range
  EXPECT_NEAR(h.cpu_energy_j().value(), 2.0, 1e-9) << "an unknown wrap adds nothing rather than a guess";
  write(cap + "/intel-rapl:0/energy_uj", "1500000\n");
  EXPECT_NEAR(h.cpu_energy_j().value(), 2.5, 1e-9) << "and counting goes on from the new value";
}

TEST(HostMonitor, ReadAndEnergyReadsShareOneRunningTotal) {
  test::TempDir dir;
  const std::string cap = dir.file("powercap"), proc = dir.file("proc");
  write(cap + "/intel-rapl:0/energy_uj", "1000000\n");
  write(cap + "/intel-rapl:0/max_energy_range_uj", "262143328850\n");
  write(cap + "/intel-rapl:0:0/energy_uj", "1\n");  // a core sub-domain
  write(cap + "/intel-rapl:0:0/max_energy_range_uj", "262143328850\n");
  write(cap + "/intel-rapl-mmio:0/energy_uj", "1\n");  // another driver's copy: not a package domain of this kind
  HostMonitor h(proc, cap);
  EXPECT_EQ(h.energy_unavailable(), "");
  write(cap + "/intel-rapl:0/energy_uj", "4000000\n");
  write(cap + "/intel-rapl:0:0/energy_uj", "900000000\n");
  EXPECT_NEAR(h.read().cpu_energy_j.value(), 3.0, 1e-9) << "the package alone";
  write(cap + "/intel-rapl:0/energy_uj", "4500000\n");
  EXPECT_NEAR(h.cpu_energy_j().value(), 3.5, 1e-9);
  EXPECT_NEAR(h.read().cpu_energy_j.value(), 3.5, 1e-9) << "no counter change: no energy added";
}

TEST(HostMonitor, AnUnreadablePackageTurnsOffEnergyForEveryPackage) {
  test::TempDir dir;
  const std::string cap = dir.file("powercap");
  write(cap + "/intel-rapl:0/energy_uj", "1000\n");
  fs::create_directories(cap + "/intel-rapl:1");  // its energy_uj missing
  HostMonitor h(dir.file("proc"), cap);
  EXPECT_FALSE(h.cpu_energy_j().has_value()) << "a sum over some packages would undercount";
  EXPECT_NE(h.energy_unavailable().find("intel-rapl:1/energy_uj"), std::string::npos) << h.energy_unavailable();
}

}  // namespace
}  // namespace tandem
