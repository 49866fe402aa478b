// The offload engine's trace (Note [Offload trace]) from stamps set by hand on the host clock:
// which steps are traced, each span's name, track, start and length, the CPU updater's spans, the
// counters asked for around the step, and the file written only after the last traced step.

#include "tandem/engine/offload_trace.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <tuple>

#include "../test_util.h"
#include "tandem/core/fs.h"

namespace tandem {
namespace {

std::vector<BlockStore> blocks(std::initializer_list<const char*> names) {
  std::vector<BlockStore> out;
  for (const char* n : names) {
    out.emplace_back();
    out.back().name = n;
  }
  return out;
}

void at(Stamp& st, double host_s) {
  st.host = host_s;
  st.set = true;
}

// Starts tracing `step` and stamps it by hand: embed, layer.0, head; forwards at +1, +2, +4 ms
// (layer.0 arriving at +1.5 and waiting for its weights until +2),
// backward ends (reverse order) at +10, +13, +17 ms, layer.0's copies, the device update; returns
// the reference (host seconds).
double stamp_a_step(OffloadTrace& trace, StepStamps& st, int64_t step) {
  at(st.fwd[0], 0.5);  // from before the traced step: cleared by start()
  trace.start(step, st, nullptr);
  EXPECT_TRUE(trace.active());
  EXPECT_FALSE(st.fwd[0].set);
  EXPECT_TRUE(st.ref.set);
  const double r = st.ref.host;
  at(st.fwd[0], r + 0.001);
  at(st.arrive[1], r + 0.0015);  // layer.0 waits 0.5 ms for its weights
  at(st.fwd[1], r + 0.002);
  at(st.arrive[2], r + 0.004);  // the head does not wait
  at(st.fwd[2], r + 0.004);
  at(st.bwd[2], r + 0.010);
  at(st.bwd[1], r + 0.013);
  at(st.bwd[0], r + 0.017);
  at(st.d2h0[1], r + 0.0135);
  at(st.d2h1[1], r + 0.014);
  at(st.h2d0[1], r + 0.020);
  at(st.h2d1[1], r + 0.0205);
  at(st.gpu0, r + 0.017);
  at(st.gpu1, r + 0.018);
  return r;
}

// A trace file's events: spans (name, track, ts, dur in us, category), counters (name, ts), tracks.
struct Parsed {
  std::vector<std::tuple<std::string, int, double, double, std::string>> spans;
  std::vector<std::pair<std::string, double>> counters;
  std::map<int, std::string> tracks;
};
Parsed parse(const std::string& path) {
  Parsed p;
  const auto j = nlohmann::json::parse(read_file(path, "trace"));
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X")
      p.spans.emplace_back(e["name"].get<std::string>(), e["tid"].get<int>(), e["ts"].get<double>(),
                           e["dur"].get<double>(), e["cat"].get<std::string>());
    else if (e["ph"] == "C")
      p.counters.emplace_back(e["name"].get<std::string>(), e["ts"].get<double>());
    else if (e["name"] == "thread_name")
      p.tracks[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  }
  return p;
}

TEST(OffloadTrace, DrawsEachStampedSpanOnItsTrack) {
  test::TempDir dir;
  StepStamps st(3, /*cuda=*/false);
  OffloadTraceOptions o;
  o.steps = {2};
  o.path = dir.file("trace.json");
  OffloadTrace trace(o, /*cuda=*/false);
  EXPECT_FALSE(trace.traces(1));
  EXPECT_TRUE(trace.traces(2));
  EXPECT_FALSE(trace.traces(3));
  const double r = stamp_a_step(trace, st, 2);
  trace.finish(st, blocks({"embed", "layer.0", "head"}), {{1, r + 0.014, r + 0.019, true}});
  EXPECT_FALSE(trace.active());
  const auto p = parse(o.path);
  EXPECT_EQ(p.tracks, (std::map<int, std::string>{{1, "compute (CPU device)"},
                                                  {2, "D2H stream (gradients)"},
                                                  {3, "H2D stream (weights)"},
                                                  {4, "CPU updater thread"}}));
  const double base = r * 1e6;
  const std::vector<std::tuple<std::string, int, double, double>> want = {
      {"forward embed", 1, base + 1000, 500},
      {"backward embed", 1, base + 13000, 4000},
      {"wait for weights layer.0", 1, base + 1500, 500},
      {"forward layer.0", 1, base + 2000, 2000},
      {"backward layer.0", 1, base + 10000, 3000},
      {"grad layer.0", 2, base + 13500, 500},
      {"weights layer.0", 3, base + 20000, 500},
      {"forward+loss+backward head", 1, base + 4000, 6000},
      {"GPU update (fused AdamW)", 1, base + 17000, 1000},
      {"CPU update (speculative) layer.0", 4, (r + 0.014) * 1e6, 5000},
  };
  ASSERT_EQ(p.spans.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& [name, track, ts, dur, cat] = p.spans[i];
    EXPECT_EQ(name, std::get<0>(want[i]));
    EXPECT_EQ(track, std::get<1>(want[i])) << name;
    EXPECT_NEAR(ts, std::get<2>(want[i]), 2e-3) << name;
    EXPECT_NEAR(dur, std::get<3>(want[i]), 2e-3) << name;
    EXPECT_EQ(cat, "step 2") << name;
  }
}

TEST(OffloadTrace, WritesAfterTheLastTracedStepWithTheCountersAroundEach) {
  test::TempDir dir;
  StepStamps st(3, false);
  std::vector<std::string> log;
  std::vector<std::chrono::steady_clock::time_point> asked_from;
  OffloadTraceOptions o;
  o.steps = {2, 3};
  o.path = dir.file("trace.json");
  o.log = [&](const std::string& l) { log.push_back(l); };
  o.counters = [&](std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point) {
    asked_from.push_back(from);
    return std::vector<CounterPoint>{{st.epoch + std::chrono::milliseconds(5), "GPU power (W)", 42.5},
                                     {st.epoch - std::chrono::seconds(1), "CPU utilisation (%)", 7}};
  };
  OffloadTrace trace(o, false);
  const auto names = blocks({"embed", "layer.0", "head"});
  const double r = stamp_a_step(trace, st, 2);
  trace.finish(st, names, {});
  EXPECT_FALSE(std::filesystem::exists(o.path)) << "written before the last traced step";
  EXPECT_TRUE(log.empty());
  ASSERT_EQ(asked_from.size(), 1u);  // the readings from a second before the step's reference on
  EXPECT_EQ(asked_from[0], st.epoch + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                          std::chrono::duration<double>(r - 1.0)));
  trace.start(3, st, nullptr);  // nothing stamped: counters only
  trace.finish(st, names, {});
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0], "trace of 2 step(s), 13 spans: " + o.path);  // 9 spans, 2 x 2 readings
  const auto p = parse(o.path);
  EXPECT_EQ(p.spans.size(), 9u);
  // Two readings per traced step, on the stamps' clock; the one from before the epoch at 0.
  const std::vector<std::pair<std::string, double>> want = {
      {"GPU power (W)", 5000.0}, {"CPU utilisation (%)", 0.0}, {"GPU power (W)", 5000.0}, {"CPU utilisation (%)", 0.0}};
  EXPECT_EQ(p.counters, want);
}

TEST(OffloadTrace, NoPathNoFile) {
  test::TempDir dir;
  StepStamps st(2, false);
  std::vector<std::string> log;
  OffloadTraceOptions o;
  o.steps = {1};
  o.log = [&](const std::string& l) { log.push_back(l); };
  OffloadTrace trace(o, false);
  trace.start(1, st, nullptr);
  at(st.fwd[0], st.ref.host + 0.001);
  at(st.fwd[1], st.ref.host + 0.002);
  trace.finish(st, blocks({"embed", "head"}), {});
  EXPECT_TRUE(log.empty());
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace tandem
