#pragma once
// A pipeline-parallel run's pieces on this rank (Note [Pipeline parallel]): the grid and its
// process groups, the cut, the stage's Blocks, the link to its neighbours and the step that drives
// them. run/pipeline_setup builds them from the run's plan.

#include <memory>
#include <string>
#include <vector>

#include "tandem/parallel/pipeline_grid.h"

namespace tandem {

class Model;
class PipelineStep;
class StageBlocks;
class StageLink;

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

/// "stage 1 of 2 (Blocks 3 .. 5 of 6: layer.2 .. head), replica 0 of 1".
std::string describe_stage(const PipelineParts& parts, const Model& model);

}  // namespace tandem
