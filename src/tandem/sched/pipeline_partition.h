#pragma once
// The automatic pipeline partitioner: which contiguous range of Blocks each pipeline stage runs,
// and how many stages, from each Block's measured cost and each device's speed and free memory.
// No LibTorch. See Note [Pipeline partition].

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/config.h"  // PipelineSchedule

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
  PipelineDevice() = default;
  PipelineDevice(std::string device, double relative_speed, int64_t free_bytes)
      : name(std::move(device)), speed(relative_speed), memory_bytes(free_bytes) {}

  std::string name;              ///< "cuda:0", "cpu"
  double speed = 1.0;            ///< work per second relative to the Blocks' measurement device
  int64_t memory_bytes = 0;      ///< free memory the stage may use
  std::optional<double> busy_w;  ///< a GPU's power while it computes, W; none for the host or when unreadable
  double idle_w = 70;            ///< a GPU's power while it waits, W (the placement cost model's default)
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
  int64_t replicas = 1;        ///< data-parallel copies of the pipeline (ranks / stages)
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

/// Speeds relative to devices[0]'s (1.0 there), where the Blocks' costs are measured; any unit in.
std::vector<PipelineDevice> relative_to_first(std::vector<PipelineDevice> devices);

/// The device of each of `stages` stages over `ranks` (one device per rank, in rank order): stage s
/// runs on ranks s n/p .. (s + 1) n/p - 1 as PipelineGrid lays them out, and is as fast and as large
/// as the slowest and the smallest of them (its replicas keep step). UserError when `stages` does
/// not divide the ranks.
std::vector<PipelineDevice> stage_devices(const std::vector<PipelineDevice>& ranks, int64_t stages);

/// The stage counts dist.pipeline_stages=`stages` allows on `ranks` ranks and `blocks` Blocks: the
/// count itself, or with auto (0) every divisor of `ranks` up to `blocks`; only 1 when the
/// embedding and the head share a matrix (`tied`). UserError for a count that cannot run.
std::vector<int64_t> pipeline_stage_counts(int64_t stages, int64_t ranks, int64_t blocks, bool tied);

/// The plan with the most micro-batches per second over all `ranks` (replicas x m / step) among
/// the stage counts `counts`, each cut by partition_pipeline over stage_devices(); UserError (the
/// last count's reason) when none fits. Note [Pipeline stage count].
PipelinePlan plan_over_ranks(const std::vector<PipelineBlockCost>& blocks, const std::vector<PipelineDevice>& ranks,
                             const std::vector<int64_t>& counts, const PartitionOptions& options);

/// What the host's cores add as one more stage beside the GPU stages (Note [CPU pipeline stage]).
struct CpuStageAnalysis {
  std::optional<PipelinePlan> gpus_alone;  ///< none when the GPU stages cannot hold the model
  std::optional<PipelinePlan> with_cpu;    ///< the best plan with the CPU as the first or last stage
  int64_t cpu_stage = -1;                  ///< with_cpu's stage on the CPU
  std::optional<double> gpus_alone_w;      ///< predicted average GPU power; none when unknown
  std::optional<double> with_cpu_w;        ///< the same with the CPU stage
  bool helps = false;   ///< with_cpu is chosen: a shorter step, the power budget met, or the model held
  std::string verdict;  ///< one line with the numbers
};

/// The fastest plan with `cpu` as one more stage (first or last) beside `gpu_stages`, against
/// the GPU stages alone; with a budget (W, 0 = none) that the GPUs alone exceed, the fastest plan
/// within it. Chosen when it shortens the step or meets the budget; the verdict says which, or
/// that the CPU is too slow to help (its share's time against the GPU stage's).
CpuStageAnalysis analyse_cpu_stage(const std::vector<PipelineBlockCost>& blocks,
                                   const std::vector<PipelineDevice>& gpu_stages, const PipelineDevice& cpu,
                                   const PartitionOptions& options, double gpu_power_budget_w);

/// A run's partition options: m = train.grad_accum micro-batches, dist.pipeline_schedule.
PartitionOptions partition_options(const Config& cfg);

/// The plan for dist.pipeline_stages over `ranks` (one device per rank, speeds in any unit: made
/// relative to ranks[0]'s, where `blocks` were measured), pipeline_stage_counts() then
/// plan_over_ranks(). `tied`: the model's embedding and head share a matrix.
PipelinePlan plan_pipeline_costs(const std::vector<PipelineBlockCost>& blocks, const Config& cfg,
                                 const std::vector<PipelineDevice>& ranks, bool tied);

/// Each stage's end Block of a plan.
std::vector<int64_t> stage_ends(const PipelinePlan& plan);

/// A table: one line per Block (time per micro-batch, static, activation and output bytes).
std::string format_pipeline_profile(const std::vector<PipelineBlockCost>& blocks);

/// A table: one line per stage (Blocks, device, predicted time and memory), then the step and
/// the bubble.
std::string format_pipeline_plan(const std::vector<PipelineBlockCost>& blocks, const PipelinePlan& plan);

}  // namespace tandem
