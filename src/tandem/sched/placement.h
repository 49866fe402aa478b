#pragma once
// Where each Block runs for the next batch, CPU or GPU, decided by a policy from the sampler's
// readings and measured per-Block costs (seed 000; Note [Placement policies]). Torch-free: the
// policies are tested on injected readings; the engine applies their decisions.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/config_values.h"

namespace tandem {

/// The device a Block runs on for a batch.
enum class BlockDevice { kGpu, kCpu };

/// A decision for one step: a device per Block (forward order), and idle time to add to the step
/// (pacing: the last resort for meeting a GPU power budget).
struct Placement {
  std::vector<BlockDevice> blocks;
  double pace_s = 0;
  int64_t cpu_blocks() const;
  /// "GGCCG...": one letter per Block.
  std::string str() const;
};

/// What a policy sees before a step.
struct PlacementInputs {
  std::optional<double> gpu_power_w;   ///< the sampler's latest average GPU power
  std::optional<double> cpu_util_pct;  ///< the host's CPU utilisation, 0..100
  int64_t step = 0;                    ///< the step about to run (1-based)
};

/// Measured costs of one Block per device, for one step's batch (Note [Placement policies]).
struct BlockDeviceCost {
  double gpu_s = 0, cpu_s = 0;  ///< forward + backward time on each device, crossing copies included
  double gpu_j = 0;             ///< GPU energy while it runs the Block on the GPU
  double cpu_j = 0;             ///< CPU energy while it runs the Block on the CPU (0 when RAPL is unreadable)
  double cpu_host_j = 0;        ///< CPU energy while the Block runs on the GPU (the host's share)
  bool movable = true;          ///< false: the Block stays on the GPU (embedding, head, pinned layers)
};

/// What a cost-model decision predicts, to be compared with what the step measured.
struct PlacementPrediction {
  double step_s = 0;
  double gpu_j = 0, cpu_j = 0;
  double gpu_power_w = 0;  ///< gpu_j / step_s
};

/// One policy behind one interface.
class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual std::string name() const = 0;
  /// The placement for the next step.
  virtual Placement decide(const PlacementInputs& in) = 0;
};

/// The same placement every step (config: one letter per Block, G or C, or "gpu"/"cpu").
class StaticPlacement : public PlacementPolicy {
 public:
  explicit StaticPlacement(Placement p) : p_(std::move(p)) {}
  std::string name() const override { return "static"; }
  Placement decide(const PlacementInputs&) override { return p_; }

 private:
  Placement p_;
};

/// The seed's rule with hysteresis.
struct ThresholdOptions {
  double gpu_power_w = 200;  ///< above this (and the CPU below cpu_util_pct) a Block moves to the CPU
  double cpu_util_pct = 80;  ///< the CPU must be less busy than this to take a Block
  double release_w = 20;     ///< a Block comes back when power is below gpu_power_w - release_w, or the CPU is busy
  int64_t dwell_steps = 5;   ///< steps between two moves
  /// Blocks that may move, first to go first (e.g. the dense CPU-friendly Blocks); they come back
  /// in the reverse order.
  std::vector<int64_t> movable;
};

/// Moves one Block to the CPU when the GPU draws more than P watts and the CPU is under U percent,
/// brings one back when the power falls below P - release or the CPU is busy; at most one move per
/// dwell_steps, so a reading near the threshold does not flap. No readings: no move.
class ThresholdPlacement : public PlacementPolicy {
 public:
  ThresholdPlacement(int64_t blocks, ThresholdOptions o);
  std::string name() const override { return "threshold"; }
  Placement decide(const PlacementInputs& in) override;

 private:
  ThresholdOptions o_;
  Placement p_;
  int64_t moved_ = 0;            // how many of `movable` are on the CPU
  int64_t last_move_step_ = -1;  // -1: never moved
};

/// The cost model's objectives.
struct CostModelOptions {
  enum class Objective {
    kMinEnergy,      ///< least joules per step with the step no longer than max_step_s
    kMaxThroughput,  ///< shortest step with average GPU power at most gpu_power_budget_w
  } objective = Objective::kMaxThroughput;
  double max_step_s = 0;          ///< kMinEnergy's throughput floor as a step-time ceiling; 0 = none
  double gpu_power_budget_w = 0;  ///< kMaxThroughput's software budget (the GPU's own limit is never changed)
  double gpu_idle_w = 70;         ///< GPU power while it waits (a CPU Block runs, or pacing)
  double cpu_idle_w = 0;          ///< CPU power above its baseline while it waits; 0 when not measured
  int64_t time_bins = 2000;       ///< resolution of the search over step times
};

/// The placement that minimises energy under a throughput floor, or maximises throughput under a
/// GPU power budget, for Blocks that run one after another (Note [Placement policies]); pacing is
/// added when no placement meets the budget. UserError for negative or non-finite costs.
Placement solve_placement(const std::vector<BlockDeviceCost>& costs, const CostModelOptions& o,
                          PlacementPrediction* prediction = nullptr);

/// The prediction for a given placement under the same model.
PlacementPrediction predict_placement(const std::vector<BlockDeviceCost>& costs, const Placement& p,
                                      const CostModelOptions& o);

/// The cost-model policy over costs the engine measures (set_costs); all-GPU until costs are known.
class CostModelPlacement : public PlacementPolicy {
 public:
  CostModelPlacement(int64_t blocks, CostModelOptions o);
  std::string name() const override { return "cost"; }
  void set_costs(std::vector<BlockDeviceCost> costs);
  Placement decide(const PlacementInputs& in) override;
  const PlacementPrediction& prediction() const { return prediction_; }
  const CostModelOptions& options() const { return o_; }
  /// Closed loop on the budget (kMaxThroughput with a budget): the average GPU power and step time
  /// measured over recent steps under the current placement; the pacing is corrected by the idle
  /// time that brings the average to the budget (half of it per call, never below zero).
  void observe(double gpu_power_w, double step_s);

 private:
  CostModelOptions o_;
  int64_t blocks_;
  std::vector<BlockDeviceCost> costs_;
  Placement current_;
  PlacementPrediction prediction_;
};

/// Note [Placement profiles]
/// The cost model's measurements, taken in the first steps of a run: `warmup` steps on the GPU
/// (not recorded), then probes of `steps_per_probe` steps each, of which the last is recorded: one
/// all-GPU probe (every Block's GPU time, the GPU's busy power P_busy = energy / step time, and the
/// host's power), then, per group of movable Blocks with the same signature (same class and size),
/// one probe with the group's first Block on the CPU (its CPU time; the GPU's power while it waits,
/// P_idle, from E = P_busy (T_gpu - g) + P_idle (T - T_gpu + g); the CPU's power while it computes,
/// the same way from RAPL). Blocks of a group share its CPU time. The step's time outside the
/// measured Blocks (optimizer tail, loss, host work) is charged to the first Block on the GPU, so
/// the all-GPU prediction is the measured step. Without energy readings the powers stay at the
/// options' values (throughput-only decisions still work).
class PlacementProfiler {
 public:
  /// `signature` per Block: -1 not movable, else a group id (Blocks of one group cost the same).
  PlacementProfiler(std::vector<int64_t> signature, int64_t warmup, int64_t steps_per_probe);
  /// The placement for the next step while profiling; nullopt once done.
  std::optional<Placement> next() const;
  /// What the step placed by next() measured: seconds per Block, the step's seconds, and its GPU
  /// and CPU energy (nullopt when unreadable).
  void record(const std::vector<double>& block_s, double step_s, std::optional<double> gpu_j,
              std::optional<double> cpu_j);
  bool done() const { return probe_ >= static_cast<int64_t>(probes_.size()); }
  /// The measured costs (after done()); `o` receives the measured idle powers where readable.
  std::vector<BlockDeviceCost> costs(CostModelOptions& o) const;
  /// "profile 2/4: layer.1 on the CPU" for logs and metrics.
  std::string describe() const;

 private:
  struct Measure {
    std::vector<double> block_s;
    double step_s = 0;
    std::optional<double> gpu_j, cpu_j;
  };
  std::vector<int64_t> signature_;
  int64_t warmup_, per_probe_;
  std::vector<int64_t> probes_;  // -1: all-GPU; else the Block run on the CPU
  int64_t probe_ = 0, step_in_probe_ = 0, warm_left_;
  std::vector<Measure> measured_;  // per probe
};

/// A static placement of `blocks` Blocks: every one on the GPU, every one on the CPU, or one per
/// letter; UserError when the letters do not count the Blocks.
Placement placement_of(const StaticBlocks& spec, int64_t blocks);
/// placement_of a placement as written: "gpu", "cpu", or one letter per Block (G/C).
Placement parse_placement(const std::string& text, int64_t blocks);

}  // namespace tandem
