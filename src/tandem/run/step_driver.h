#pragma once
// One optimizer step's mechanics, whoever runs the forwards and backwards: the CLI's trainer
// (StepRunner over its loader) and the Python engine (EngineCore under the user's loop) both drive
// a step through this. It opens the step (the placement policy's tick, the offload engine's
// begin_step), tells the engine and the gradient reducer which micro-batch is the last, carries
// the fp16 loss scale, gives a step up after an out-of-memory error and cuts the micro-batch
// (MicroBatchSplit), runs the update (the offload engine's, or the optimizer's over
// device-resident parameters) with the loss scale's update and the step's one host
// synchronisation, and completes the step's metrics row.

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/io/checkpoint.h"
#include "tandem/run/micro_batch_split.h"

namespace tandem {

class GradReducer;
class Optimizer;
class ParamStore;
class PlacementDriver;
class RunMetrics;
struct RunContext;
struct TelemetrySample;

/// What a step updates. `engine`, `store`, `reducer` and `placement` may be null (no offload
/// engine; one replica; no placement policy).
struct StepTargets {
  Optimizer* optimizer = nullptr;  ///< the resident optimizer, or the engine's adapter
  OffloadEngine* engine = nullptr;
  const ParamStore* store = nullptr;  ///< the engine's store (its metrics)
  GradReducer* reducer = nullptr;
  PlacementDriver* placement = nullptr;
  std::vector<torch::Tensor> params;  ///< without the engine: every trainable tensor (of the stage) once
  /// The norm of every process's parameters from the norm of `params` (a pipeline's stages, Note
  /// [Pipeline parallel]); empty: `params` are all.
  std::function<torch::Tensor(const torch::Tensor&)> global_norm;
};

/// What one step did, read after its one host synchronisation.
struct StepResult {
  double loss = 0;       ///< this rank's loss as given to read() (NaN when unknown)
  double grad_norm = 0;  ///< the global norm before clipping
  bool skipped = false;  ///< a non-finite gradient (or an fp16 overflow): nothing was updated
  double loss_scale = 1;
};

class StepDriver {
 public:
  /// The loss scale starts from `state`'s (a resumed run's). `publish` takes the rows the driver
  /// writes between steps (an out-of-memory retry).
  StepDriver(const Config& cfg, const RunContext& ctx, StepTargets targets, const TrainerState& state,
             std::function<void(const nlohmann::json&)> publish);

  /// Opens step `step` + 1 at `lr`: the placement policy's decision from `latest`, the engine's
  /// counters for the step's row, the engine's begin_step.
  void begin_step(int64_t step, double lr, const TelemetrySample* latest);
  /// The engine's begin_step again, after abandon() (the step's retry).
  void restart_step(double lr);
  /// Before a micro-batch's backward: whether it is the step's last (Blocks are dispatched as the
  /// last backward completes them).
  void begin_micro(bool last);
  /// The fp16 loss scale (1 otherwise), as a 0-d-broadcastable device tensor and as the host's copy.
  torch::Tensor scale_loss(const torch::Tensor& loss) const;
  double loss_scale() const { return host_scale_; }

  /// The update at `lr` (norm, clipping, the non-finite check, the optimizer or the engine's end
  /// of step) and the loss scale's; then read() the step's one host copy, with `loss` (0-d, on the
  /// device) the step's loss on this rank, at the end of step `step` + 1 (what a rank waits for
  /// there, for the hang report of several ranks).
  void update(double lr);
  StepResult read(const torch::Tensor& loss, int64_t step);

  /// Gives the open step up: the engine undoes what it began, or the gradients are zeroed; the
  /// device's cache is freed.
  void abandon();
  /// After an out-of-memory error at step `step` + 1 in micro-batches of `rows` rows, the step
  /// abandoned: cuts them into twice as many parts (UserError naming the fix when they cannot
  /// be), logged and published as a row.
  void retry_smaller(int64_t step, const std::string& what, int64_t rows);
  const MicroBatchSplit& split() const { return split_; }

  /// Sleeps toward a GPU power budget (Note [Placement policies]); the step's time counts it.
  void pace() const;
  /// Completes a step's metrics row after `r` (its base: step_metrics_row and the caller's own
  /// fields): device memory, the loss scale, the cut micro-batch (and its grow-back), the skip,
  /// the telemetry, the engine's counters since begin_step, the placement policy's reading.
  void complete_row(nlohmann::json& row, const StepResult& r, double step_s, int64_t tokens, RunMetrics& metrics);

  /// The loss scaler's state, for a checkpoint, and from one.
  void save_scaler(TrainerState& state) const;
  void load_scaler(const TrainerState& state);

 private:
  const Config& cfg_;
  const RunContext& ctx_;
  StepTargets t_;
  std::function<void(const nlohmann::json&)> publish_;
  const bool fp16_;
  torch::TensorOptions fopts_;
  torch::Tensor scale_, growth_tracker_;  // (1) fp32, (1) int32 on the device
  double host_scale_ = 1.0;               // scale_ as the last host copy read it
  torch::Tensor norm_, found_inf_;        // the open step's, on the device
  EngineStats stats0_;
  MicroBatchSplit split_;
};

}  // namespace tandem
