// The split tuner on the CPU device: when solves are due, the times and costs it hands the solver
// (from stamps set by hand and the CPU updater's clock, against sched/update_split's own prediction),
// the split it applies (a fixed k, the memory range, the 2% rule), calibration where a side has no
// Block, and its log line.

#include "tandem/engine/split_tuner.h"

#include <gtest/gtest.h>

#include <torch/torch.h>
#include "engine_fixtures.h"

#include <memory>
#include <thread>

#include "tandem/engine/step_stamps.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

ModelSpec small_spec() { return test::small_engine_spec(3); }

void at(Stamp& st, double host_s) {
  st.host = host_s;
  st.set = true;
}

// A store with `gpu_blocks` device-side Blocks and a step stamped by hand: Block i's forward starts
// at 10 ms * i, the backward ends 20 ms apart in reverse order (the head's 20 ms after its forward),
// each CPU-updated Block's copies down and up take d2h_s and h2d_s, the device update device_s.
struct Rig {
  std::shared_ptr<Model> model;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<StepStamps> stamps;
  std::vector<std::string> log;

  explicit Rig(int64_t gpu_blocks) {
    torch::manual_seed(7);
    model = build_model(small_spec(), false);
    store = std::make_unique<ParamStore>(*model, ParamStoreOptions{}, gpu_blocks);
    stamps = std::make_unique<StepStamps>(store->blocks().size(), false);
  }
  size_t n() const { return store->blocks().size(); }
  // With `wait_s`, each CPU-updated Block but the embedding waits that long for its upload between
  // its arrival and its start.
  void stamp(double d2h_s, double h2d_s, double device_s, double wait_s = 0) {
    auto& st = *stamps;
    const size_t last = n() - 1;
    double waited = 0;
    for (size_t i = 0; i < n(); ++i) {
      at(st.arrive[i], 0.01 * double(i) + waited);
      if (i > 0 && store->blocks()[i].side == UpdateSide::kCpu) waited += wait_s;
      at(st.fwd[i], 0.01 * double(i) + waited);
    }
    for (size_t i = 0; i < n(); ++i) {
      at(st.bwd[i], 0.01 * double(last) + waited + 0.02 * double(n() - i));
      at(st.d2h0[i], 1.0);
      at(st.d2h1[i], 1.0 + d2h_s);
      at(st.h2d0[i], 2.0);
      at(st.h2d1[i], 2.0 + h2d_s);
    }
    at(st.gpu0, 3.0);
    at(st.gpu1, 3.0 + device_s);
  }
  SplitTunerOptions options() {
    SplitTunerOptions o;
    o.solve = true;
    o.log = [this](const std::string& l) { log.push_back(l); };
    return o;
  }
  // What the tuner should hand the solver, by hand from the stamps above (the same roundings).
  std::vector<BlockTiming> timing() const {
    std::vector<BlockTiming> t(n());
    const double last = 0.01 * double(n() - 1);
    for (size_t i = 0; i < n(); ++i) {
      t[i].params = store->blocks()[i].shard_numel;
      if (i + 1 < n()) {
        t[i].fwd_s = 0.01 * double(i + 1) - 0.01 * double(i);
        t[i].bwd_s = (last + 0.02 * double(n() - i)) - (last + 0.02 * double(n() - i - 1));
      } else {
        t[i].bwd_s = (last + 0.02) - last;
      }
    }
    return t;
  }
  // A copy's or update's length as the stamps give it: (start + s) - start.
  static double span(double start, double s) { return (start + s) - start; }
  // Per parameter of the CPU-updated Blocks: the copies' summed lengths.
  double per_cpu_param(double start, double s) const {
    double sum = 0;
    for (const auto& b : store->blocks())
      if (b.side == UpdateSide::kCpu) sum += span(start, s);
    return sum / double(params(UpdateSide::kCpu));
  }
  int64_t params(UpdateSide side) const {
    int64_t p = 0;
    for (const auto& b : store->blocks())
      if (b.side == side) p += b.shard_numel;
    return p;
  }
};

SplitInputs inputs(int64_t step, double cpu_s, int64_t cpu_params) {
  SplitInputs in;
  in.step = step;
  in.cpu_update_s = cpu_s;
  in.cpu_updated_params = cpu_params;
  in.cpu_start = SplitCosts::CpuStart::kAfterBackward;
  return in;
}

TEST(SplitTuner, SolvesAtTheFirstSolveStepAndEveryResolveEveryAfter) {
  Rig rig(0);
  const auto due = [&](bool solve, int64_t every) {
    SplitTunerOptions o;
    o.solve = solve;
    o.first_solve_step = 3;
    o.resolve_every = every;
    SplitTuner t(*rig.store, *rig.stamps, nullptr, o);
    std::vector<int64_t> out;
    for (int64_t begun = 0; begun < 10; ++begun)
      if (t.begin_step(begun)) out.push_back(begun);
    return out;
  };
  EXPECT_EQ(due(true, 2), (std::vector<int64_t>{3, 5, 7, 9}));
  EXPECT_EQ(due(true, 0), (std::vector<int64_t>{3}));
  EXPECT_EQ(due(false, 2), (std::vector<int64_t>{}));
}

TEST(SplitTuner, HandsTheSolverTheStampedTimesAndTheUpdatersCostsThenMovesBlocks) {
  Rig rig(1);
  rig.stamp(0.004, 0.002, 0.001);
  auto o = rig.options();
  o.fixed_k = 0.4;  // 2 of 5 Blocks
  SplitTuner t(*rig.store, *rig.stamps, nullptr, o);
  for (int64_t begun = 0; begun < 3; ++begun) {
    t.begin_step(begun);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(t.begin_step(3));
  SplitCosts c;  // before the solve moves Blocks
  c.cpu_update_s_per_param = 0.25 / 1000;
  c.gpu_update_s_per_param = Rig::span(3.0, 0.001) / double(rig.params(UpdateSide::kGpu));
  c.d2h_s_per_param = rig.per_cpu_param(1.0, 0.004);
  c.h2d_s_per_param = rig.per_cpu_param(2.0, 0.002);
  c.gpu_bytes_per_param_resident = 12;
  c.cpu_start = SplitCosts::CpuStart::kAfterBackward;
  t.solve(inputs(3, 0.25, 1000));
  const auto& s = t.status();
  EXPECT_TRUE(s.solved);
  EXPECT_EQ(s.gpu_blocks, 2);
  EXPECT_DOUBLE_EQ(s.k, 0.4);
  EXPECT_EQ(rig.store->gpu_blocks(), 2);
  EXPECT_DOUBLE_EQ(s.alpha, c.gpu_update_s_per_param / c.cpu_update_s_per_param);
  EXPECT_DOUBLE_EQ(s.predicted_step_s, predict_step(rig.timing(), c, 2).step_s);
  EXPECT_DOUBLE_EQ(s.predicted_measured_s, predict_step(rig.timing(), c, 1).step_s);
  EXPECT_GE(s.measured_step_s, 0.005);  // the median of the steps begun 5 ms apart
  ASSERT_EQ(rig.log.size(), 1u);
  EXPECT_EQ(rig.log[0].rfind("update split at step 3: k = 0.40 (2 of 5 blocks GPU-updated), alpha = ", 0), 0u)
      << rig.log[0];
  // The next solve counts only the CPU updates since this one.
  t.solve(inputs(5, 0.25 + 0.5, 1000 + 4000));
  EXPECT_DOUBLE_EQ(t.status().alpha, (Rig::span(3.0, 0.001) / double(rig.params(UpdateSide::kGpu))) / (0.5 / 4000));
  EXPECT_NE(rig.log.back().find("(2 of 5 blocks GPU-updated, unchanged)"), std::string::npos) << rig.log.back();
}

TEST(SplitTuner, KeepsTheSplitUnlessTheNewOneIsPredictedTwoPercentFaster) {
  // Updates and copies nearly free: every split predicts nearly the compute time.
  Rig rig(2);
  rig.stamp(0.0, 0.0, 1e-9);
  SplitTuner t(*rig.store, *rig.stamps, nullptr, rig.options());
  SplitCosts c;
  c.cpu_update_s_per_param = 1e-9 / 1000;
  c.gpu_update_s_per_param = Rig::span(3.0, 1e-9) / double(rig.params(UpdateSide::kGpu));
  c.gpu_bytes_per_param_resident = 12;
  c.cpu_start = SplitCosts::CpuStart::kAfterBackward;
  const auto d = solve_update_split(rig.timing(), c, int64_t{1} << 40);
  ASSERT_NE(d.gpu_blocks, 2) << "the solver itself would keep the split: nothing tested";
  ASSERT_GT(d.predicted_step_s, 0.98 * predict_step(rig.timing(), c, 2).step_s);
  t.solve(inputs(3, 1e-9, 1000));
  EXPECT_EQ(rig.store->gpu_blocks(), 2);
  EXPECT_EQ(t.status().gpu_blocks, 2);
  // CPU updates a thousand times dearer: the solver's choice is applied.
  Rig slow(2);
  slow.stamp(0.0, 0.0, 1e-9);
  SplitTuner u(*slow.store, *slow.stamps, nullptr, slow.options());
  c.cpu_update_s_per_param = 1e-3;
  const auto e = solve_update_split(slow.timing(), c, int64_t{1} << 40);
  ASSERT_NE(e.gpu_blocks, 2);
  u.solve(inputs(3, 1e-3 * 1000, 1000));
  EXPECT_EQ(slow.store->gpu_blocks(), e.gpu_blocks);
  EXPECT_EQ(u.status().gpu_blocks, e.gpu_blocks);
}

TEST(SplitTuner, AForwardsWaitForUploadsDoesNotHoldTheSplitDown) {
  // CPU updates dear (1 us per parameter), copies and the device update nearly free; every
  // CPU-updated Block's forward waited 50 ms for its upload (Note [Step stamps]).
  Rig rig(1);
  rig.stamp(1e-6, 1e-6, 1e-6, /*wait_s=*/0.05);
  auto o = rig.options();
  o.max_gpu_blocks = 3;
  SplitCosts c;
  c.cpu_update_s_per_param = 1e-6;
  c.gpu_update_s_per_param = Rig::span(3.0, 1e-6) / double(rig.params(UpdateSide::kGpu));
  c.d2h_s_per_param = rig.per_cpu_param(1.0, 1e-6);
  c.h2d_s_per_param = rig.per_cpu_param(2.0, 1e-6);
  c.gpu_bytes_per_param_resident = 12;
  c.cpu_start = SplitCosts::CpuStart::kAfterBackward;
  int64_t budget = 0;
  for (size_t i = 0; i < 3; ++i) budget += rig.store->blocks()[i].shard_numel * 12;
  // Counted as forward time, the waits would hide the uploads they wait for: the solver would see
  // no gain in more GPU-updated Blocks.
  std::vector<BlockTiming> with_waits = rig.timing();
  for (size_t i = 0; i + 1 < rig.n(); ++i) with_waits[i].fwd_s += 0.05;  // Blocks 1 to 4 are CPU-updated
  ASSERT_LE(solve_update_split(with_waits, c, budget).gpu_blocks, 1)
      << "the waits would not hold the split: nothing tested";
  const auto d = solve_update_split(rig.timing(), c, budget);
  ASSERT_EQ(d.gpu_blocks, 3);
  SplitTuner t(*rig.store, *rig.stamps, nullptr, o);
  t.solve(inputs(3, 1.0, 1000000));
  EXPECT_EQ(rig.store->gpu_blocks(), 3);
  EXPECT_NEAR(t.status().predicted_step_s, d.predicted_step_s, 1e-9);
  // Without arrival stamps (the next Block's start stands in), the waits count and the split stays.
  Rig old(1);
  old.stamp(1e-6, 1e-6, 1e-6, 0.05);
  for (auto& st : old.stamps->arrive) st.set = false;
  SplitTuner u(*old.store, *old.stamps, nullptr, o);
  u.solve(inputs(3, 1.0, 1000000));
  EXPECT_LE(old.store->gpu_blocks(), 1);
}

TEST(SplitTuner, StaysInTheMemoryPlansRange) {
  Rig rig(0);
  rig.stamp(0.001, 0.001, 0.0);
  auto o = rig.options();
  o.min_gpu_blocks = o.max_gpu_blocks = 3;
  SplitTuner t(*rig.store, *rig.stamps, nullptr, o);
  t.solve(inputs(3, 0.1, 1000));
  EXPECT_EQ(rig.store->gpu_blocks(), 3);
  EXPECT_DOUBLE_EQ(t.status().k, 3.0 / 5.0);
}

TEST(SplitTuner, CalibratesTheCostsOfASideWithNoBlock) {
  // No device-side Block: its update cost is calibrated (the CPU kernel, on the CPU device); the CPU
  // side's and the copies' come from the step.
  Rig cpu_only(0);
  cpu_only.stamp(0.001, 0.001, 0.0);
  SplitTuner t(*cpu_only.store, *cpu_only.stamps, nullptr, cpu_only.options());
  t.solve(inputs(3, 0.1, 1000));
  EXPECT_GT(t.calibrated().gpu, 0.0);
  EXPECT_EQ(t.calibrated().cpu, 0.0);
  EXPECT_EQ(t.calibrated().d2h, 0.0);
  EXPECT_DOUBLE_EQ(t.status().alpha, t.calibrated().gpu / (0.1 / 1000));
  // Every Block on the device side: the CPU update and the copies are calibrated.
  Rig gpu_only(5);
  gpu_only.stamp(0.0, 0.0, 0.002);
  SplitTuner u(*gpu_only.store, *gpu_only.stamps, nullptr, gpu_only.options());
  const double gpu_cost = Rig::span(3.0, 0.002) / double(gpu_only.params(UpdateSide::kGpu));  // before any move
  u.solve(inputs(3, 0.0, 0));
  EXPECT_GT(u.calibrated().cpu, 0.0);
  EXPECT_GT(u.calibrated().d2h, 0.0);
  EXPECT_GT(u.calibrated().h2d, 0.0);
  EXPECT_EQ(u.calibrated().gpu, 0.0);
  EXPECT_DOUBLE_EQ(u.status().alpha, gpu_cost / u.calibrated().cpu);
}

}  // namespace
}  // namespace tandem
