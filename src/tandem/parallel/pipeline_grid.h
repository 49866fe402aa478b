#pragma once
// Where this rank sits in the pp x dp process grid of a pipeline-parallel run (Note [Pipeline
// parallel]). Torch-free.
//
// Note [Pipeline parallel]
// With dist.pipeline_stages = p > 1 the world of W ranks is a grid of p stages x W/p data-parallel
// replicas, stage-major: rank r runs stage r / dp on the rows of replica r % dp. Stage s computes a
// contiguous range of Blocks (the cut, Note [Pipeline partition]); its first stage embeds, its last
// one computes the head and the loss. Each step's train.grad_accum micro-batches flow through the
// stages in the order of dist.pipeline_schedule (Note [Pipeline schedules]): activations go down
// and their gradients come back point to point between neighbours of one replica (parallel/stage_link.h),
// each stage's Blocks accumulate their gradients over the micro-batches, the replicas of a stage sum
// theirs over its data-parallel group, the global norm is summed over the stages, and every stage
// updates its own Blocks (the optimizer or the offload engine over the stage's Blocks alone). So a
// step equals one process's with the same global batch up to the summation order.

#include <string>
#include <vector>

namespace tandem {

class PipelineGrid {
 public:
  PipelineGrid() = default;
  /// UserError when `stages` does not divide `world` or is below 1.
  PipelineGrid(int rank, int world, int stages);

  int stages() const { return stages_; }
  int replicas() const { return replicas_; }  ///< the data-parallel width: world / stages
  int stage() const { return rank_ / replicas_; }
  int replica() const { return rank_ % replicas_; }
  bool pipelined() const { return stages_ > 1; }
  bool first_stage() const { return stage() == 0; }
  bool last_stage() const { return stage() == stages_ - 1; }
  int rank_of(int stage, int replica) const { return stage * replicas_ + replica; }
  int previous_rank() const { return rank_of(stage() - 1, replica()); }  ///< first_stage(): none
  int next_rank() const { return rank_of(stage() + 1, replica()); }      ///< last_stage(): none
  /// The ranks of this stage's data-parallel group, in replica order.
  std::vector<int> replica_ranks() const;
  /// "stage 1 of 2, replica 0 of 2".
  std::string describe() const;

 private:
  int rank_ = 0, stages_ = 1, replicas_ = 1;
};

/// Stage ends (each stage's end Block, ascending, the last = `blocks`) from dist.pipeline_cut's
/// first p - 1 ends; UserError naming the fix when they do not cut `blocks` Blocks into `stages`
/// non-empty ranges.
std::vector<int64_t> given_pipeline_cut(const std::vector<int64_t>& cut, int64_t stages, int64_t blocks);
/// Equal Block counts per stage (the first stages take the remainder); UserError when stages > blocks.
std::vector<int64_t> even_pipeline_cut(int64_t stages, int64_t blocks);

}  // namespace tandem
