#pragma once
// One optimizer step of the CLI's trainer: the micro-batches of gradient accumulation from its
// loader under autocast (or through the pipeline's schedule), over the step driver (StepDriver:
// the loss scale, the out-of-memory retry, the update); and held-out evaluation.

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/io/checkpoint.h"
#include "tandem/run/step_driver.h"

namespace tandem {

class BatchLoader;
class Model;
class PipelineStep;
class StepTimer;
struct TelemetrySample;
struct RunContext;
struct RunPlan;

class StepRunner {
 public:
  /// `pipeline` may be null (no pipeline, Note [Pipeline parallel]); `targets`: what the step
  /// updates (its `global_norm` is set here for a pipeline). The loss scale starts from `state`'s
  /// (a resumed run's); `publish` takes the rows written between steps.
  StepRunner(const RunPlan& plan, const RunContext& ctx, Model& model, StepTargets targets, PipelineStep* pipeline,
             StepTimer& timer, std::function<void(const nlohmann::json&)> publish, const TrainerState& state);

  /// Runs step `step` + 1 at learning rate `lr` on `loader`'s next micro-batches, each rank's loss
  /// weighted by `rank_share` of the global batch (Note [Data parallel]); `latest`: the telemetry
  /// the placement policy decides from. StepResult::loss: this rank's mean over its micro-batches.
  StepResult run(int64_t step, double lr, BatchLoader& loader, double rank_share,
                 const TelemetrySample* latest = nullptr);
  StepDriver& driver() { return driver_; }
  int64_t oom_retries() const { return driver_.split().retries(); }

  /// Mean loss over `batches` micro-batches of `loader` from its start, without gradients.
  double evaluate(BatchLoader& loader, int64_t batches);

 private:
  void accumulate(int64_t step, BatchLoader& loader, double rank_share, torch::Tensor& loss_sum);
  void accumulate_pipeline(int64_t step, BatchLoader& loader, double rank_share, torch::Tensor& loss_sum);

  const RunPlan& plan_;
  const RunContext& ctx_;
  Model& model_;
  PipelineStep* pipeline_;
  StepTimer& timer_;
  torch::TensorOptions fopts_;
  int replicas_ = 1;  // the data-parallel width (Note [Data parallel])
  StepDriver driver_;
};

}  // namespace tandem
