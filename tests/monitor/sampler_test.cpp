// The telemetry sampler (monitor/sampler.h) over fake trees: sample_now() feeds the history and the
// callback, utilisation counts from construction, the history keeps the newest, since() is strictly
// newer, the thread samples on its period and stops at once, and energy is read on demand.
#include "tandem/monitor/sampler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// One core with `busy` and `idle` jiffies.
void write_stat(const std::string& proc, uint64_t busy, uint64_t idle) {
  const std::string fields = " " + std::to_string(busy) + " 0 0 " + std::to_string(idle) + " 0 0 0 0 0 0\n";
  write(proc + "/stat", "cpu " + fields + "cpu0" + fields);
}

double steady_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

struct FakeHost {
  test::TempDir dir;
  std::string proc = dir.file("proc"), cap = dir.file("powercap");
  FakeHost() {
    write_stat(proc, 100, 100);
    write(proc + "/meminfo", "MemTotal: 4096 kB\nMemAvailable: 1024 kB\n");
    write(cap + "/intel-rapl:0/energy_uj", "1000000\n");
    write(cap + "/intel-rapl:0/max_energy_range_uj", "262143328850\n");
  }
  SamplerOptions options(double period_s) const {
    SamplerOptions o;
    o.period_s = period_s;
    o.proc_root = proc;
    o.powercap_root = cap;
    return o;
  }
};

TEST(Sampler, ASampleNowGoesToTheHistoryAndTheCallbackOnTheCallersThread) {
  FakeHost host;
  std::vector<TelemetrySample> seen;
  std::vector<std::thread::id> threads;
  std::mutex mu;
  SamplerOptions o = host.options(1000);  // the thread never samples in this test
  o.on_sample = [&](const TelemetrySample& s) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(s);
    threads.push_back(std::this_thread::get_id());
  };
  Sampler sampler(o);
  EXPECT_TRUE(sampler.why_missing().empty()) << "no GPU asked for, RAPL readable";
  EXPECT_FALSE(sampler.has_gpu());
  EXPECT_EQ(sampler.samples(), 0);
  const TelemetrySample none = sampler.latest();
  EXPECT_EQ(none.t, 0.0) << "before the first sample: an empty one";
  EXPECT_FALSE(none.host.cpu_pct.has_value());

  write_stat(host.proc, 130, 170);  // +30 busy of +100 since the sampler started
  sampler.sample_now();
  EXPECT_EQ(sampler.samples(), 1);
  const TelemetrySample s = sampler.latest();
  ASSERT_TRUE(s.host.cpu_pct.has_value()) << "utilisation since the reading taken at construction";
  EXPECT_NEAR(*s.host.cpu_pct, 30.0, 1e-9);
  EXPECT_EQ(s.host.mem_used_bytes.value_or(-1), 3072 * 1024);
  EXPECT_TRUE(s.gpus.empty());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].t, s.t) << "the callback gets the sample the history keeps";
  EXPECT_EQ(threads[0], std::this_thread::get_id());
}

TEST(Sampler, SampleTimesCountFromTheSamplersStart) {
  FakeHost host;
  const double before = steady_s();
  Sampler sampler(host.options(1000));
  const double after = steady_s();
  EXPECT_GE(sampler.start_s(), before);
  EXPECT_LE(sampler.start_s(), after);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  sampler.sample_now();
  const double t = sampler.latest().t, elapsed = steady_s() - before;
  EXPECT_GE(t, 0.020);
  EXPECT_LE(t, elapsed);
}

TEST(Sampler, TheHistoryKeepsTheNewestSamplesAndSinceIsStrictlyNewer) {
  FakeHost host;
  SamplerOptions o = host.options(1000);
  o.history = 3;
  Sampler sampler(o);
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    write_stat(host.proc, 100 + 10 * (i + 1), 100 + 90 * (i + 1));
    sampler.sample_now();
    times.push_back(sampler.latest().t);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(sampler.samples(), 5) << "every sample is counted, kept or not";
  const auto kept = sampler.since(-1.0);
  ASSERT_EQ(kept.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(kept[i].t, times[i + 2]) << "the newest three, oldest first";
  const auto newer = sampler.since(times[3]);
  ASSERT_EQ(newer.size(), 1u);
  EXPECT_EQ(newer[0].t, times[4]);
  EXPECT_TRUE(sampler.since(times[4]).empty());
  EXPECT_NEAR(*kept.back().host.cpu_pct, 10.0, 1e-9) << "each sample's utilisation is since the previous one";
}

TEST(Sampler, TheThreadSamplesOnItsPeriodAndStopsAtOnce) {
  FakeHost host;
  std::atomic<int> from_thread{0};
  const auto main_thread = std::this_thread::get_id();
  SamplerOptions o = host.options(0.005);
  o.on_sample = [&](const TelemetrySample&) {
    if (std::this_thread::get_id() != main_thread) ++from_thread;
  };
  {
    Sampler sampler(o);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (from_thread < 3 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_GE(from_thread.load(), 3);
  }
  // A long period: destruction wakes the thread instead of waiting out the period.
  const auto t0 = Clock::now();
  { Sampler slow(host.options(600)); }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 60.0);
}

TEST(Sampler, EnergyIsReadOnDemandFromTheCounters) {
  FakeHost host;
  Sampler sampler(host.options(1000));
  EXPECT_EQ(sampler.energy_now().cpu_j.value_or(-1), 0.0);
  write(host.cap + "/intel-rapl:0/energy_uj", "3500000\n");
  const EnergyCounters e = sampler.energy_now();
  EXPECT_NEAR(e.cpu_j.value_or(-1), 2.5, 1e-9);
  EXPECT_FALSE(e.gpu_j.has_value()) << "no GPU watched";
  write(host.cap + "/intel-rapl:0/energy_uj", "4000000\n");
  sampler.sample_now();
  EXPECT_NEAR(sampler.latest().host.cpu_energy_j.value_or(-1), 3.0, 1e-9) << "one running total for both";
}

TEST(Sampler, WithoutRaplItSaysSoOnce) {
  FakeHost host;
  SamplerOptions o = host.options(1000);
  o.powercap_root = host.dir.file("no-powercap");
  Sampler sampler(o);
  ASSERT_EQ(sampler.why_missing().size(), 1u);
  EXPECT_NE(sampler.why_missing()[0].find("no CPU energy"), std::string::npos);
  EXPECT_FALSE(sampler.energy_now().cpu_j.has_value());
}

}  // namespace
}  // namespace tandem
