#pragma once
// A pipeline-parallel run's pieces on this rank (Note [Pipeline parallel]): the stage count and
// the cut (given, or the partitioner's), the grid and its process groups, the stage's Blocks, the
// link to its neighbours and the step that drives them; refused with the fix when the run cannot
// be cut that way.

#include <memory>
#include <string>
#include <vector>

#include "tandem/dist/pipeline_grid.h"

namespace tandem {

class Model;
class PipelineStep;
class StageBlocks;
class StageLink;
struct RunContext;
struct RunPlan;

struct PipelineParts {
  PipelineGrid grid;
  std::vector<int64_t> ends;    ///< each stage's end Block
  double predicted_step_s = 0;  ///< the partitioner's prediction (0 = none made)
  std::unique_ptr<StageBlocks> blocks;
  std::unique_ptr<StageLink> link;
  std::unique_ptr<PipelineStep> step;

  PipelineParts();
  PipelineParts(PipelineParts&&) noexcept;
  PipelineParts& operator=(PipelineParts&&) noexcept;
  ~PipelineParts();
  bool on() const { return step != nullptr; }
};

/// Empty parts when dist.pipeline_stages resolves to 1. Every rank at once (the process groups).
/// With the partitioner's cut, the memory plan of this rank's stage is settled here
/// (settle_stage_plan): refused with the numbers before the stage's buffers are allocated.
PipelineParts open_pipeline(Model& model, RunPlan& plan, RunContext& ctx);

/// "stage 1 of 2 (Blocks 3 .. 5 of 6: layer.2 .. head), replica 0 of 1".
std::string describe_stage(const PipelineParts& parts, const Model& model);

}  // namespace tandem
