// The cost model's measurements (Note [Placement profiles]) on a synthetic machine whose true
// per-Block costs and powers are known, and the closed loop that corrects pacing toward a GPU
// power budget when the model's idle power is wrong.

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/sched/placement.h"

namespace tandem {
namespace {

// Blocks run one after another; a CPU Block leaves the GPU idle. Block 0 (embedding) and 4 (head)
// stay on the GPU; 1 and 2 are one group, 3 another.
struct Machine {
  std::vector<int64_t> signature{-1, 0, 0, 1, -1};
  std::vector<double> gpu_s{0.002, 0.010, 0.010, 0.020, 0.003};
  std::vector<double> group_cpu_s{0.030, 0.050};
  double overhead_s = 0.005;  // outside every Block: loss, optimizer tail, host work
  double gpu_busy_w = 400, gpu_idle_w = 90;
  double host_w = 30, cpu_run_w = 50;  // the host's baseline, and the extra while it computes a Block

  struct Step {
    std::vector<double> block_s;
    double step_s = 0, gpu_j = 0, cpu_j = 0;
  };

  Step run(const Placement& p) const {
    Step s;
    double cpu_time = 0;
    for (size_t i = 0; i < gpu_s.size(); ++i) {
      const bool on_cpu = p.blocks[i] == BlockDevice::kCpu;
      const double t = on_cpu ? group_cpu_s[static_cast<size_t>(signature[i])] : gpu_s[i];
      s.step_s += t;
      if (on_cpu) cpu_time += t;
      // The engine times decoder layers only: the embedding and the head report 0.
      s.block_s.push_back(signature[i] < 0 ? 0.0 : t);
    }
    s.step_s += overhead_s;
    s.gpu_j = gpu_busy_w * (s.step_s - cpu_time) + gpu_idle_w * cpu_time;
    s.cpu_j = host_w * s.step_s + cpu_run_w * cpu_time;
    return s;
  }

  int64_t groups() const { return static_cast<int64_t>(group_cpu_s.size()); }
};

Placement all_gpu(size_t n) {
  Placement p;
  p.blocks.assign(n, BlockDevice::kGpu);
  return p;
}

// Runs the profiler to the end on `m`; returns the placements it asked for, in order.
std::vector<std::string> profile(PlacementProfiler& prof, const Machine& m, bool energy) {
  std::vector<std::string> placed;
  while (const auto p = prof.next()) {
    const auto s = m.run(*p);
    placed.push_back(p->str());
    prof.record(s.block_s, s.step_s, energy ? std::optional<double>(s.gpu_j) : std::nullopt,
                energy ? std::optional<double>(s.cpu_j) : std::nullopt);
    if (placed.size() > 1000) break;  // a profiler that never finishes fails below, not by hanging
  }
  return placed;
}

TEST(PlacementProfiler, MeasuresEachGroupOnceAndTheIdlePower) {
  const Machine m;
  const int64_t warmup = 3, per_probe = 2;
  PlacementProfiler prof(m.signature, warmup, per_probe);
  const auto placed = profile(prof, m, true);
  EXPECT_TRUE(prof.done());
  ASSERT_EQ(static_cast<int64_t>(placed.size()), warmup + per_probe * (1 + m.groups()));
  for (int64_t i = 0; i < warmup; ++i) EXPECT_EQ(placed[static_cast<size_t>(i)], "GGGGG") << "warm-up step " << i;
  // Probes: all-GPU, then the first Block of each group alone on the CPU.
  const std::vector<std::string> probes{"GGGGG", "GCGGG", "GGGCG"};
  for (size_t k = 0; k < probes.size(); ++k)
    for (int64_t j = 0; j < per_probe; ++j)
      EXPECT_EQ(placed[static_cast<size_t>(warmup + static_cast<int64_t>(k) * per_probe + j)], probes[k])
          << "probe " << k << " step " << j;

  CostModelOptions o;
  o.gpu_idle_w = 70;
  const auto c = prof.costs(o);
  ASSERT_EQ(c.size(), 5u);
  const std::vector<bool> movable{false, true, true, true, false};
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].movable, movable[i]) << "block " << i;
    if (!movable[i]) {
      EXPECT_EQ(c[i].cpu_s, 0) << "block " << i;
      continue;
    }
    const double cpu_s = m.group_cpu_s[static_cast<size_t>(m.signature[i])];
    EXPECT_NEAR(c[i].gpu_s, m.gpu_s[i], 1e-12) << "block " << i;
    EXPECT_NEAR(c[i].cpu_s, cpu_s, 1e-12) << "block " << i;  // block 2 shares block 1's probe
    EXPECT_NEAR(c[i].gpu_j, m.gpu_s[i] * m.gpu_busy_w, 1e-9) << "block " << i;
    EXPECT_NEAR(c[i].cpu_j, cpu_s * (m.host_w + m.cpu_run_w), 1e-9) << "block " << i;
  }
  EXPECT_NEAR(o.gpu_idle_w, m.gpu_idle_w, 1e-6 * m.gpu_idle_w);

  // The time outside the Blocks is charged to the embedding: the all-GPU prediction is the measured step.
  const auto measured = m.run(all_gpu(5));
  const auto predicted = predict_placement(c, all_gpu(5), o);
  EXPECT_NEAR(predicted.step_s, measured.step_s, 1e-12);
  EXPECT_NEAR(predicted.gpu_j, measured.gpu_j, 1e-9);
  EXPECT_NEAR(predicted.cpu_j, measured.cpu_j, 1e-9);
  // With the measured powers the model reproduces a placement it never ran, too.
  Placement mixed = all_gpu(5);
  mixed.blocks[2] = mixed.blocks[3] = BlockDevice::kCpu;
  const auto mixed_measured = m.run(mixed);
  const auto mixed_predicted = predict_placement(c, mixed, o);
  EXPECT_NEAR(mixed_predicted.step_s, mixed_measured.step_s, 1e-12);
  EXPECT_NEAR(mixed_predicted.gpu_j, mixed_measured.gpu_j, 1e-9);
  EXPECT_NEAR(mixed_predicted.cpu_j, mixed_measured.cpu_j, 1e-9);
}

TEST(PlacementProfiler, WithoutEnergyReadingsGivesTimesAndKeepsTheIdlePower) {
  const Machine m;
  PlacementProfiler prof(m.signature, 0, 1);
  const auto placed = profile(prof, m, false);
  EXPECT_EQ(placed, (std::vector<std::string>{"GGGGG", "GCGGG", "GGGCG"}));
  CostModelOptions o;
  o.gpu_idle_w = 70;
  const auto c = prof.costs(o);
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(o.gpu_idle_w, 70);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_NEAR(c[i].gpu_s, m.gpu_s[i], 1e-12) << "block " << i;
    EXPECT_NEAR(c[i].cpu_s, m.group_cpu_s[static_cast<size_t>(m.signature[i])], 1e-12) << "block " << i;
  }
  EXPECT_NEAR(predict_placement(c, all_gpu(5), o).step_s, m.run(all_gpu(5)).step_s, 1e-12);
  // Throughput-only decisions still work: no budget, the fastest placement is all-GPU here.
  EXPECT_EQ(solve_placement(c, o).str(), "GGGGG");
}

TEST(PlacementProfiler, SolvingOverMeasuredCostsMeetsABudgetBetweenIdleAndBusy) {
  const Machine m;
  PlacementProfiler prof(m.signature, 1, 2);
  profile(prof, m, true);
  ASSERT_TRUE(prof.done());
  CostModelOptions o;
  const auto c = prof.costs(o);
  o.objective = CostModelOptions::Objective::kMaxThroughput;
  for (const double budget : {100.0, 150.0, 200.0, 300.0, 390.0}) {
    o.gpu_power_budget_w = budget;
    PlacementPrediction got;
    const Placement p = solve_placement(c, o, &got);
    EXPECT_LE(got.gpu_power_w, budget + 1e-6) << budget << " W: " << p.str() << " pace " << p.pace_s;
    // The prediction is what the machine does with that placement, pacing at the true idle power.
    Placement unpaced = p;
    unpaced.pace_s = 0;
    const auto run = m.run(unpaced);
    const double avg = (run.gpu_j + m.gpu_idle_w * p.pace_s) / (run.step_s + p.pace_s);
    EXPECT_NEAR(avg, got.gpu_power_w, 1e-6) << budget << " W: " << p.str();
    // All-GPU paced to the budget is a candidate: the solver does no worse.
    const auto a = predict_placement(c, all_gpu(5), o);
    Placement paced = all_gpu(5);
    paced.pace_s = std::max(0.0, (a.gpu_j - budget * a.step_s) / (budget - o.gpu_idle_w));
    EXPECT_LE(got.step_s, predict_placement(c, paced, o).step_s * (1 + 1e-9)) << budget << " W: " << p.str();
  }
}

// A plant whose idle power is 100 W while the model believes 70 W: pacing p gives the average
// (E_busy + 100 p) / (T + p) with E_busy = 450 W x 0.1 s over T = 0.1 s.
constexpr double kBusyJ = 45, kStepS = 0.1, kTrueIdleW = 100;

double plant_power(double pace_s) { return (kBusyJ + kTrueIdleW * pace_s) / (kStepS + pace_s); }

CostModelPlacement one_block_policy(double budget_w, CostModelOptions::Objective objective) {
  CostModelOptions o;
  o.objective = objective;
  o.gpu_power_budget_w = budget_w;
  o.gpu_idle_w = 70;
  CostModelPlacement policy(1, o);
  BlockDeviceCost c;
  c.gpu_s = kStepS;
  c.gpu_j = kBusyJ;
  c.movable = false;
  policy.set_costs({c});
  return policy;
}

TEST(CostModelPlacementLoop, SettlesOnTheBudgetDespiteAWrongIdlePower) {
  auto policy = one_block_policy(300, CostModelOptions::Objective::kMaxThroughput);
  const double open_loop = policy.decide({}).pace_s;
  EXPECT_GT(open_loop, 0);
  EXPECT_GT(plant_power(open_loop), 300 * 1.02);  // the model's pacing alone misses: idle is 100 W, not 70
  for (int i = 0; i < 20; ++i) {
    const double pace = policy.decide({}).pace_s;
    policy.observe(plant_power(pace), kStepS + pace);
  }
  const Placement p = policy.decide({});
  EXPECT_GT(p.pace_s, 0);
  EXPECT_EQ(p.str(), "G");
  EXPECT_NEAR(plant_power(p.pace_s), 300, 0.02 * 300) << "pace " << p.pace_s;
  EXPECT_NEAR(policy.prediction().step_s, kStepS + p.pace_s, 1e-12);  // the prediction follows the pacing
}

TEST(CostModelPlacementLoop, BudgetAboveTheBusyPowerNeedsNoPacing) {
  auto policy = one_block_policy(500, CostModelOptions::Objective::kMaxThroughput);
  EXPECT_EQ(policy.decide({}).pace_s, 0);
  // A spike over the budget paces the step; the plant's readings then bring it back to none.
  policy.observe(600, kStepS);
  EXPECT_GT(policy.decide({}).pace_s, 0);
  for (int i = 0; i < 20; ++i) {
    const double pace = policy.decide({}).pace_s;
    policy.observe(plant_power(pace), kStepS + pace);
  }
  EXPECT_EQ(policy.decide({}).pace_s, 0);
  for (int i = 0; i < 5; ++i) {
    policy.observe(plant_power(0), kStepS);
    EXPECT_EQ(policy.decide({}).pace_s, 0);
  }
}

TEST(CostModelPlacementLoop, DoesNothingForTheEnergyObjective) {
  auto policy = one_block_policy(300, CostModelOptions::Objective::kMinEnergy);
  const double pace = policy.decide({}).pace_s;
  const double step = policy.prediction().step_s;
  for (int i = 0; i < 5; ++i) policy.observe(1000, kStepS);
  EXPECT_EQ(policy.decide({}).pace_s, pace);
  EXPECT_EQ(policy.prediction().step_s, step);
  // Nor before it has costs.
  CostModelOptions o;
  o.gpu_power_budget_w = 300;
  CostModelPlacement empty(2, o);
  empty.observe(1000, kStepS);
  EXPECT_EQ(empty.decide({}).pace_s, 0);
}

}  // namespace
}  // namespace tandem
