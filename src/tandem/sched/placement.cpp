#include "tandem/sched/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tandem/core/error.h"

namespace tandem {

// Note [Placement policies]
// A Placement puts each Block on the GPU or the CPU for one step (seed 000, generalised to any
// Block). Three policies sit behind PlacementPolicy:
//  - static: the config's placement every step;
//  - threshold, the seed's rule: when the GPU draws more than P watts (200) and the CPU is less
//    than U percent busy (80), the next movable Block goes to the CPU; when the power falls below
//    P - release or the CPU is busy, the last one moved comes back. One move per dwell_steps, and
//    the release band, keep a reading near P from flapping; no readings, no moves.
//  - cost model: per Block and device, the measured forward+backward time and energy of a step's
//    batch. The Blocks run one after another, so a placement's step time is the sum of its Blocks'
//    times (crossing copies are inside the CPU times, measured in place), its GPU energy the sum of
//    the GPU Blocks' energy plus idle power while CPU Blocks run, its CPU energy likewise. Either
//    the least energy with the step no longer than a ceiling (a throughput floor), or the shortest
//    step whose average GPU power (GPU joules over step time) stays within a budget in watts, a
//    software budget: tandem never touches the GPU's own power limit. Both are exact over a grid of
//    step times (a dynamic program over Blocks x time bins, exact times carried along), so the
//    result does not depend on a greedy order. When no placement meets the budget the step is
//    paced: idle time added at the GPU's idle power until the average meets it, the same remedy as
//    running all-GPU and idling, which the search therefore always includes and can only beat.

int64_t Placement::cpu_blocks() const { return std::count(blocks.begin(), blocks.end(), BlockDevice::kCpu); }

std::string Placement::str() const {
  std::string s;
  for (const auto d : blocks) s += d == BlockDevice::kGpu ? 'G' : 'C';
  return s;
}

Placement placement_of(const StaticBlocks& spec, int64_t blocks) {
  Placement p;
  if (spec.kind != StaticBlocks::Kind::kLetters) {
    p.blocks.assign(static_cast<size_t>(blocks),
                    spec.kind == StaticBlocks::Kind::kGpu ? BlockDevice::kGpu : BlockDevice::kCpu);
    return p;
  }
  TANDEM_CHECK(static_cast<int64_t>(spec.on_cpu.size()) == blocks, "placement '", spec.str(), "' has ",
               spec.on_cpu.size(), " letters for ", blocks, " blocks; give one G or C per block, or gpu / cpu");
  for (const bool cpu : spec.on_cpu) p.blocks.push_back(cpu ? BlockDevice::kCpu : BlockDevice::kGpu);
  return p;
}

Placement parse_placement(const std::string& text, int64_t blocks) {
  return placement_of(StaticBlocks::parse(text, "placement"), blocks);
}

ThresholdPlacement::ThresholdPlacement(int64_t blocks, ThresholdOptions o) : o_(std::move(o)) {
  p_.blocks.assign(static_cast<size_t>(blocks), BlockDevice::kGpu);
  for (const auto b : o_.movable)
    TANDEM_CHECK(b >= 0 && b < blocks, "placement.movable names block ", b, "; the model has ", blocks);
  TANDEM_CHECK(o_.release_w >= 0 && o_.dwell_steps >= 1, "placement.release_w must be >= 0 and dwell_steps >= 1");
}

Placement ThresholdPlacement::decide(const PlacementInputs& in) {
  if (!in.gpu_power_w || !in.cpu_util_pct) return p_;
  if (last_move_step_ >= 0 && in.step - last_move_step_ < o_.dwell_steps) return p_;
  const bool hot = *in.gpu_power_w > o_.gpu_power_w && *in.cpu_util_pct < o_.cpu_util_pct;
  const bool cool = *in.gpu_power_w < o_.gpu_power_w - o_.release_w || *in.cpu_util_pct >= o_.cpu_util_pct;
  if (hot && moved_ < static_cast<int64_t>(o_.movable.size())) {
    p_.blocks[static_cast<size_t>(o_.movable[static_cast<size_t>(moved_)])] = BlockDevice::kCpu;
    ++moved_;
    last_move_step_ = in.step;
  } else if (cool && moved_ > 0) {
    --moved_;
    p_.blocks[static_cast<size_t>(o_.movable[static_cast<size_t>(moved_)])] = BlockDevice::kGpu;
    last_move_step_ = in.step;
  }
  return p_;
}

namespace {

void check_costs(const std::vector<BlockDeviceCost>& costs, const CostModelOptions& o) {
  TANDEM_CHECK(!costs.empty(), "the cost model needs at least one block");
  for (const auto& c : costs)
    for (const double v : {c.gpu_s, c.cpu_s, c.gpu_j, c.cpu_j, c.cpu_host_j})
      TANDEM_CHECK(std::isfinite(v) && v >= 0, "a block cost is negative or not finite (", v, ")");
  TANDEM_CHECK(
      o.time_bins >= 10 && o.gpu_idle_w >= 0 && o.cpu_idle_w >= 0 && o.max_step_s >= 0 && o.gpu_power_budget_w >= 0,
      "cost model options out of range");
}

struct Cost {
  double t, gpu_j, cpu_j;
};

Cost block_cost(const BlockDeviceCost& c, BlockDevice d, const CostModelOptions& o) {
  if (d == BlockDevice::kGpu) return {c.gpu_s, c.gpu_j, c.cpu_host_j};
  return {c.cpu_s, o.gpu_idle_w * c.cpu_s, c.cpu_j};
}

}  // namespace

PlacementPrediction predict_placement(const std::vector<BlockDeviceCost>& costs, const Placement& p,
                                      const CostModelOptions& o) {
  TANDEM_ASSERT(p.blocks.size() == costs.size(), "placement of ", p.blocks.size(), " blocks for ", costs.size());
  PlacementPrediction r;
  for (size_t i = 0; i < costs.size(); ++i) {
    const Cost c = block_cost(costs[i], p.blocks[i], o);
    r.step_s += c.t;
    r.gpu_j += c.gpu_j;
    r.cpu_j += c.cpu_j;
  }
  r.step_s += p.pace_s;
  r.gpu_j += o.gpu_idle_w * p.pace_s;
  r.cpu_j += o.cpu_idle_w * p.pace_s;
  r.gpu_power_w = r.step_s > 0 ? r.gpu_j / r.step_s : 0.0;
  return r;
}

Placement solve_placement(const std::vector<BlockDeviceCost>& costs, const CostModelOptions& o,
                          PlacementPrediction* prediction) {
  check_costs(costs, o);
  const size_t n = costs.size();
  const bool min_energy = o.objective == CostModelOptions::Objective::kMinEnergy;
  // The quantity minimised per time bin: total energy (kMinEnergy) or GPU energy (kMaxThroughput).
  const auto value = [&](const Cost& c) { return min_energy ? c.gpu_j + c.cpu_j : c.gpu_j; };
  double t_max = 0;
  for (const auto& c : costs) t_max += c.movable ? std::max(c.gpu_s, c.cpu_s) : c.gpu_s;
  const int64_t bins = o.time_bins;
  const double width = t_max > 0 ? t_max / double(bins) : 1.0;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[b]: least value with cumulative time in bin b; time[b] the exact time of that entry.
  std::vector<double> best(static_cast<size_t>(bins) + 1, kInf), time(best.size(), 0);
  std::vector<std::vector<int8_t>> choice(n, std::vector<int8_t>(best.size(), -1));  // device of Block i
  std::vector<std::vector<int32_t>> from(n, std::vector<int32_t>(best.size(), -1));  // bin before Block i
  best[0] = 0;
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> nb(best.size(), kInf), nt(best.size(), 0);
    for (size_t b = 0; b < best.size(); ++b) {
      if (best[b] == kInf) continue;
      for (const BlockDevice d : {BlockDevice::kGpu, BlockDevice::kCpu}) {
        if (d == BlockDevice::kCpu && !costs[i].movable) continue;
        const Cost c = block_cost(costs[i], d, o);
        const double t = time[b] + c.t;
        const size_t nbin = std::min<size_t>(best.size() - 1, static_cast<size_t>(std::llround(t / width)));
        const double v = best[b] + value(c);
        if (v < nb[nbin] || (v == nb[nbin] && t < nt[nbin])) {
          nb[nbin] = v;
          nt[nbin] = t;
          choice[i][nbin] = d == BlockDevice::kGpu ? 0 : 1;
          from[i][nbin] = static_cast<int32_t>(b);
        }
      }
    }
    best.swap(nb);
    time.swap(nt);
  }
  // Pick the final bin, and the pacing it needs.
  size_t pick = best.size();
  double pick_score = kInf, pick_pace = 0;
  for (size_t b = 0; b < best.size(); ++b) {
    if (best[b] == kInf) continue;
    double score, pace = 0;
    if (min_energy) {
      // Within the ceiling: least energy. Over it: a large penalty so the fastest wins when none fits.
      score = (o.max_step_s > 0 && time[b] > o.max_step_s) ? 1e30 + time[b] : best[b];
    } else if (o.gpu_power_budget_w <= 0 || best[b] <= o.gpu_power_budget_w * time[b]) {
      score = time[b];
    } else if (o.gpu_power_budget_w > o.gpu_idle_w) {
      pace = (best[b] - o.gpu_power_budget_w * time[b]) / (o.gpu_power_budget_w - o.gpu_idle_w);
      score = time[b] + pace;
    } else {
      // A budget at or under the idle power cannot be met by pacing: the least average power.
      score = 1e30 + (time[b] > 0 ? best[b] / time[b] : 0);
    }
    if (score < pick_score) {
      pick_score = score;
      pick = b;
      pick_pace = pace;
    }
  }
  TANDEM_ASSERT(pick < best.size(), "no placement found");
  Placement p;
  p.blocks.assign(n, BlockDevice::kGpu);
  size_t b = pick;
  for (size_t i = n; i-- > 0;) {
    p.blocks[i] = choice[i][b] == 1 ? BlockDevice::kCpu : BlockDevice::kGpu;
    b = static_cast<size_t>(from[i][b]);
  }
  p.pace_s = pick_pace;
  if (prediction) *prediction = predict_placement(costs, p, o);
  return p;
}

CostModelPlacement::CostModelPlacement(int64_t blocks, CostModelOptions o) : o_(o), blocks_(blocks) {
  current_.blocks.assign(static_cast<size_t>(blocks), BlockDevice::kGpu);
}

void CostModelPlacement::set_costs(std::vector<BlockDeviceCost> costs) {
  TANDEM_CHECK(static_cast<int64_t>(costs.size()) == blocks_, "costs for ", costs.size(), " blocks; the model has ",
               blocks_);
  costs_ = std::move(costs);
  current_ = solve_placement(costs_, o_, &prediction_);
}

Placement CostModelPlacement::decide(const PlacementInputs&) { return current_; }

void CostModelPlacement::observe(double gpu_power_w, double step_s) {
  if (costs_.empty() || o_.objective != CostModelOptions::Objective::kMaxThroughput || o_.gpu_power_budget_w <= 0 ||
      o_.gpu_power_budget_w <= o_.gpu_idle_w || !(step_s > 0) || !std::isfinite(gpu_power_w))
    return;
  // Idle time s at gpu_idle_w that moves the average from P to the budget B over a step of T:
  // (P T + idle s) / (T + s) = B, so s = T (P - B) / (B - idle); negative when under the budget.
  const double b = o_.gpu_power_budget_w;
  const double s = step_s * (gpu_power_w - b) / (b - o_.gpu_idle_w);
  current_.pace_s = std::max(0.0, current_.pace_s + 0.5 * s);
  prediction_ = predict_placement(costs_, current_, o_);
}

PlacementProfiler::PlacementProfiler(std::vector<int64_t> signature, int64_t warmup, int64_t steps_per_probe)
    : signature_(std::move(signature)),
      warmup_(warmup),
      per_probe_(std::max<int64_t>(1, steps_per_probe)),
      warm_left_(std::max<int64_t>(0, warmup)) {
  probes_.push_back(-1);
  std::vector<int64_t> seen;
  for (size_t i = 0; i < signature_.size(); ++i) {
    const int64_t g = signature_[i];
    if (g < 0 || std::find(seen.begin(), seen.end(), g) != seen.end()) continue;
    seen.push_back(g);
    probes_.push_back(static_cast<int64_t>(i));
  }
  measured_.resize(probes_.size());
}

std::optional<Placement> PlacementProfiler::next() const {
  if (done()) return std::nullopt;
  Placement p;
  p.blocks.assign(signature_.size(), BlockDevice::kGpu);
  const int64_t cpu = warm_left_ > 0 ? -1 : probes_[static_cast<size_t>(probe_)];
  if (cpu >= 0) p.blocks[static_cast<size_t>(cpu)] = BlockDevice::kCpu;
  return p;
}

void PlacementProfiler::record(const std::vector<double>& block_s, double step_s, std::optional<double> gpu_j,
                               std::optional<double> cpu_j) {
  if (done()) return;
  if (warm_left_ > 0) {
    --warm_left_;
    return;
  }
  if (++step_in_probe_ < per_probe_) return;  // the probe's first steps warm it up
  TANDEM_CHECK(block_s.size() == signature_.size(), "profile: times for ", block_s.size(), " blocks of ",
               signature_.size());
  measured_[static_cast<size_t>(probe_)] = {block_s, step_s, gpu_j, cpu_j};
  step_in_probe_ = 0;
  ++probe_;
}

std::string PlacementProfiler::describe() const {
  if (done()) return "profile done";
  if (warm_left_ > 0) return "profile warm-up (all on the GPU)";
  const int64_t cpu = probes_[static_cast<size_t>(probe_)];
  return "profile " + std::to_string(probe_ + 1) + "/" + std::to_string(probes_.size()) + ": " +
         (cpu < 0 ? std::string("all on the GPU") : "block " + std::to_string(cpu) + " on the CPU");
}

std::vector<BlockDeviceCost> PlacementProfiler::costs(CostModelOptions& o) const {
  TANDEM_ASSERT(done(), "profile not finished");
  const size_t n = signature_.size();
  const Measure& a = measured_[0];
  std::vector<BlockDeviceCost> c(n);
  double measured = 0;
  for (size_t i = 0; i < n; ++i) {
    c[i].gpu_s = std::max(0.0, a.block_s[i]);
    c[i].movable = signature_[i] >= 0;
    measured += c[i].gpu_s;
  }
  // The rest of the step goes to the first Block that stays on the GPU.
  const double rest = std::max(0.0, a.step_s - measured);
  size_t anchor = 0;
  while (anchor + 1 < n && c[anchor].movable) ++anchor;
  c[anchor].gpu_s += rest;
  const double t_a = a.step_s;
  const double p_busy = a.gpu_j && t_a > 0 ? *a.gpu_j / t_a : 0.0;
  const double p_host = a.cpu_j && t_a > 0 ? *a.cpu_j / t_a : 0.0;
  double idle_sum = 0;
  int64_t idle_n = 0;
  for (size_t k = 1; k < probes_.size(); ++k) {
    const auto r = static_cast<size_t>(probes_[k]);
    const Measure& m = measured_[k];
    const double cpu_s = std::max(0.0, m.block_s[r]);
    const double g = c[r].gpu_s;
    // The GPU was busy for t_a - g and waited for the rest of the probe's step.
    const double wait = m.step_s - (t_a - g);
    double p_run = 0;
    if (wait > 1e-6) {
      if (m.gpu_j && a.gpu_j) {
        idle_sum += std::clamp((*m.gpu_j - p_busy * (t_a - g)) / wait, 0.0, p_busy);
        ++idle_n;
      }
      if (m.cpu_j && a.cpu_j) p_run = std::max(0.0, (*m.cpu_j - p_host * (t_a - g)) / wait);
    }
    for (size_t i = 0; i < n; ++i)
      if (signature_[i] == signature_[r]) {
        c[i].cpu_s = cpu_s;
        c[i].cpu_j = cpu_s * p_run;
      }
  }
  if (idle_n > 0) o.gpu_idle_w = idle_sum / double(idle_n);
  for (size_t i = 0; i < n; ++i) {
    c[i].gpu_j = c[i].gpu_s * p_busy;
    c[i].cpu_host_j = c[i].gpu_s * p_host;
    if (!c[i].movable) c[i].cpu_s = 0;
  }
  return c;
}

}  // namespace tandem
