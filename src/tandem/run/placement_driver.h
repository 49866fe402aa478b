#pragma once
// The step loop's side of Block placement (Note [Block placement], Note [Placement policies]): the
// policy from the config, its inputs from the sampler, the cost model's profiles, the decisions
// applied to the offload engine, and what they predicted against what the step measured.

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/sched/placement.h"

namespace tandem {

class BlockSequence;
class OffloadEngine;
struct TelemetrySample;

/// Per Block: may it run on the CPU (placement.movable; every decoder layer when empty). UserError
/// for an index out of range or one that is not a decoder layer.
std::vector<bool> placement_movable(const PlacementConfig& cfg, const BlockSequence& model);

class PlacementDriver {
 public:
  PlacementDriver(const PlacementConfig& cfg, BlockSequence& model, OffloadEngine& engine,
                  std::function<void(const std::string&)> log);
  ~PlacementDriver();
  /// Before the step's begin_step: the policy's decision for step `step` (1-based) from the
  /// latest telemetry sample (null: no readings), applied to the engine.
  void before_step(int64_t step, const TelemetrySample* latest);
  /// Idle time to add to this step (pacing toward a GPU power budget).
  double pace_s() const { return current_.pace_s; }
  /// After the step: what it measured (seconds, GPU and CPU joules where readable); adds the
  /// placement's keys to the step's metrics row.
  void after_step(double step_s, std::optional<double> gpu_j, std::optional<double> cpu_j, nlohmann::json& row);
  /// For summary.json: the policy, moves, the measured costs and the last prediction.
  nlohmann::json summary() const;

 private:
  PlacementConfig cfg_;
  BlockSequence& model_;
  OffloadEngine& engine_;
  std::function<void(const std::string&)> log_;
  std::vector<bool> movable_;
  std::unique_ptr<PlacementPolicy> policy_;
  CostModelPlacement* cost_ = nullptr;  // policy_ when it is the cost model, once profiled
  std::unique_ptr<PlacementProfiler> profiler_;
  CostModelOptions cost_options_;
  std::vector<BlockDeviceCost> costs_;
  Placement current_;
  PlacementInputs inputs_;
  std::string phase_;
  int64_t moves_ = 0;
  double window_j_ = 0, window_s_ = 0;  // cost model's closed loop: GPU joules and seconds since the last observe
  int64_t window_steps_ = 0;
};

}  // namespace tandem
