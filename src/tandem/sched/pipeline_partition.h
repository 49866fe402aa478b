#pragma once
// The automatic pipeline partitioner: which contiguous range of Blocks each pipeline stage runs,
// and how many stages, from each Block's measured cost and each device's speed and free memory.
// No LibTorch. See Note [Pipeline partition].

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

/// One Block's cost for one micro-batch, on a device of speed 1.
struct PipelineBlockCost {
  std::string name;
  double time_s = 0;             ///< forward + backward (recomputation included)
  int64_t static_bytes = 0;      ///< weights, gradients and the optimizer state kept on the device
  int64_t activation_bytes = 0;  ///< what one micro-batch in flight keeps until its backward
  int64_t output_bytes = 0;      ///< the activation sent to the next stage (and its gradient back)
};

/// A device a stage may run on: a GPU, or the host's cores (seed 000's hybrid placement).
struct PipelineDevice {
  std::string name;          ///< "cuda:0", "cpu"
  double speed = 1.0;        ///< work per second relative to the Blocks' measurement device
  int64_t memory_bytes = 0;  ///< free memory the stage may use
};

/// The order in which a stage runs its micro-batches.
enum class PipelineSchedule {
  kGPipe,  ///< every forward, then every backward: a stage holds all m micro-batches' activations
  k1F1B,   ///< one forward, one backward in the steady state: stage s holds at most p - s of them
};

struct PartitionOptions {
  int64_t micro_batches = 8;  ///< m, train.grad_accum
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  /// Bytes per second between neighbouring stages (an activation goes down, its gradient comes back).
  double link_bytes_per_s = 25e9;
};

/// One stage of a plan: Blocks [first, end) on `device`.
struct StagePlan {
  int64_t first = 0, end = 0;
  std::string device;
  double time_s = 0;         ///< one micro-batch's forward + backward, transfers included
  int64_t memory_bytes = 0;  ///< its peak under the schedule
  int64_t memory_limit = 0;  ///< the device's
};

struct PipelinePlan {
  std::vector<StagePlan> stages;
  double step_s = 0;           ///< predicted: (m - 1) x the slowest stage + the sum of the stages
  double bubble_fraction = 0;  ///< the share of a stage's step spent idle, on average
};

/// The predicted step of stages cut at `ends` (each stage's end Block, ascending, the last one the
/// Block count) on devices[0..ends.size()), and each stage's memory. The objective the partitioner
/// minimises; exposed for tests and for `tandem inspect --partition`.
PipelinePlan evaluate_pipeline(const std::vector<PipelineBlockCost>& blocks, const std::vector<PipelineDevice>& devices,
                               const std::vector<int64_t>& ends, const PartitionOptions& options);

/// Whether every stage of `plan` fits its device's memory.
bool fits(const PipelinePlan& plan);

/// The fastest contiguous cut of `blocks` into exactly devices.size() stages, stage s on devices[s],
/// each within its device's memory. UserError naming the stage that cannot fit when none does.
PipelinePlan partition_pipeline(const std::vector<PipelineBlockCost>& blocks,
                                const std::vector<PipelineDevice>& devices, const PartitionOptions& options);

/// The fastest plan over stage counts p in `stage_counts` (stage s on devices[s]); UserError when
/// no count fits.
PipelinePlan choose_pipeline(const std::vector<PipelineBlockCost>& blocks, const std::vector<PipelineDevice>& devices,
                             const std::vector<int64_t>& stage_counts, const PartitionOptions& options);

/// A table: one line per stage (Blocks, device, predicted time and memory), then the step and
/// the bubble.
std::string format_pipeline_plan(const std::vector<PipelineBlockCost>& blocks, const PipelinePlan& plan);

}  // namespace tandem
