#pragma once
// One optimizer step of the trainer: the micro-batches of gradient accumulation under autocast,
// the loss scale (fp16), the out-of-memory retry that halves the micro-batch (Note [Adaptive
// micro-batch]), the global norm with clipping and the non-finite check, and the update (the
// offload engine's, or the optimizer's over device-resident parameters); and held-out evaluation.

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/io/checkpoint.h"

namespace tandem {

class BatchLoader;
class GradReducer;
class Model;
class OffloadEngine;
class Optimizer;
class PipelineStep;
class StepTimer;
struct RunContext;
struct RunPlan;

/// What one step did, read after its one host synchronisation.
struct StepResult {
  double loss = 0;       ///< this rank's loss: the mean over its micro-batches (before the ranks' sum)
  double grad_norm = 0;  ///< the global norm before clipping
  bool skipped = false;  ///< a non-finite gradient (or an fp16 overflow): nothing was updated
  double loss_scale = 1;
};

class StepRunner {
 public:
  /// `engine`, `reducer` and `pipeline` may be null (no offload engine; one replica; no pipeline,
  /// Note [Pipeline parallel]). `params`: the tensors this process updates without the engine
  /// (every trainable one, or its pipeline stage's). The loss scale starts from `state`'s (a
  /// resumed run's).
  StepRunner(const RunPlan& plan, const RunContext& ctx, Model& model, std::vector<torch::Tensor> params,
             Optimizer& optimizer, OffloadEngine* engine, GradReducer* reducer, PipelineStep* pipeline,
             StepTimer& timer, std::function<void(const nlohmann::json&)> publish, const TrainerState& state);

  /// Runs step `step` + 1 at learning rate `lr` on `loader`'s next micro-batches, each rank's loss
  /// weighted by `rank_share` of the global batch (Note [Data parallel]).
  StepResult run(int64_t step, double lr, BatchLoader& loader, double rank_share);
  /// The loss scaler's state, for a checkpoint.
  void save_scaler(TrainerState& state) const;
  /// After a step's row is built: the effective micro-batch while it is halved, and the grow-back.
  void after_step(nlohmann::json& row);
  int64_t oom_retries() const { return oom_retries_; }

  /// Mean loss over `batches` micro-batches of `loader` from its start, without gradients.
  double evaluate(BatchLoader& loader, int64_t batches);

 private:
  void accumulate(int64_t step, BatchLoader& loader, double rank_share, torch::Tensor& loss_sum);
  void accumulate_pipeline(int64_t step, BatchLoader& loader, double rank_share, torch::Tensor& loss_sum);
  void retry_after_oom(int64_t step, const std::string& what, BatchLoader& loader, int64_t data_pos0);
  void update(double lr, torch::Tensor& norm, torch::Tensor& found_inf);

  const RunPlan& plan_;
  const RunContext& ctx_;
  Model& model_;
  Optimizer& optimizer_;
  OffloadEngine* engine_;
  GradReducer* reducer_;
  PipelineStep* pipeline_;
  StepTimer& timer_;
  std::function<void(const nlohmann::json&)> publish_;
  const bool fp16_;
  torch::TensorOptions fopts_;
  torch::Tensor scale_, growth_tracker_;  // (1) fp32, (1) int32 on the device
  std::vector<torch::Tensor> params_;     // device-resident runs: every trainable tensor (of the stage) once
  int replicas_ = 1;                      // the data-parallel width (Note [Data parallel])
  int64_t oom_parts_ = 1, oom_clean_steps_ = 0, oom_retries_ = 0;
};

}  // namespace tandem
