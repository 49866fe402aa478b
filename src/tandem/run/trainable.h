#pragma once
// What a run trains and what updates it: the whole model or its pipeline stage's Blocks (Note
// [Pipeline parallel]), on the device or through the offload engine, with the optimizer the
// checkpoints read and the gradient reducer of the data-parallel replicas.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "tandem/run/engine_setup.h"
#include "tandem/run/step_driver.h"

namespace tandem {

class GatheredOptimizer;
class GradReducer;
class Model;
class Optimizer;
class RunMetrics;
struct PipelineParts;
struct RunContext;
struct RunPlan;

struct Trainable {
  OffloadParts offload;                         ///< with offload.optimizer=cpu
  std::unique_ptr<Optimizer> stage_optimizer;   ///< the optimizer (or the engine's adapter)
  std::unique_ptr<GatheredOptimizer> gathered;  ///< a pipeline's: the stages' states for checkpoints
  std::unique_ptr<GradReducer> reducer;         ///< replicas without the engine
  std::vector<torch::Tensor> params;            ///< the tensors this process updates without the engine

  Trainable();
  Trainable(Trainable&&) noexcept;
  ~Trainable();
  /// The optimizer checkpoints read and write.
  Optimizer& optimizer();
  OffloadEngine* engine() { return offload.engine.get(); }
  /// What the step driver updates.
  StepTargets targets();
};

/// Places the model (or the stage's Blocks) on the device or under the offload engine and builds
/// what updates them. `build_s`: the model's build time, for the log.
Trainable build_trainable(Model& model, PipelineParts& pipeline, const RunPlan& plan, const RunContext& ctx,
                          RunMetrics& metrics, double build_s);

}  // namespace tandem
