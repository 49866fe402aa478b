#pragma once
// The automatic partitioner's measurements and the cut a pipeline-parallel run takes from them
// (Note [Pipeline profile]): each Block's forward and backward time for one micro-batch and its
// bytes on a stage's device, each device's speed and free memory; the plan itself is the
// partitioner's (sched/pipeline_partition.h, Note [Pipeline partition]).

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/sched/pipeline_partition.h"

namespace tandem {

class Model;

/// Each Block's cost for one micro-batch (train.micro_batch rows of `seq_len` tokens) on `device`,
/// as a stage runs it: the run's weights (fp32 under autocast, or the compute dtype under
/// offload.optimizer=cpu), train.precision's autocast and model.checkpointing. Takes each Block's
/// parameters to `device` for its measurement and puts them back as they were; call it before
/// the offload engine or a stage binds the model.
std::vector<PipelineBlockCost> profile_pipeline_blocks(Model& model, const Config& cfg, int64_t seq_len,
                                                       const c10::Device& device);

/// The Block timed on every device for its speed: the middle decoder layer.
size_t speed_probe_block(const Model& model);

/// `device` (of this process) as a stage device: its free memory (a GPU's less the workspace
/// reserve, the host's MemAvailable), its speed as probe Blocks per second (relative_to_first()
/// makes a list relative) and, for a GPU whose power NVML reads, its power while it computes.
PipelineDevice measure_pipeline_device(Model& model, const Config& cfg, int64_t seq_len, const c10::Device& device);

/// Every GPU this process sees, measured, in index order; empty without one.
std::vector<PipelineDevice> visible_pipeline_gpus(Model& model, const Config& cfg, int64_t seq_len);

/// The plan for dist.pipeline_stages (a count, or auto: Note [Pipeline stage count]) over `devices`,
/// one per rank in rank order, speeds relative to devices[0]'s, on which (a device of this process)
/// the Blocks are profiled; m = train.grad_accum micro-batches under dist.pipeline_schedule. The
/// profile and the plan as a table in *table when not null. UserError (one line, with the fix)
/// when no plan fits or there are more stages than Blocks. Its timings differ between processes:
/// one rank plans and the others take its cut.
PipelinePlan plan_pipeline(Model& model, const Config& cfg, int64_t seq_len, const std::vector<PipelineDevice>& devices,
                           std::string* table);

/// plan_pipeline from costs already measured (or synthetic ones): the plan, and in *table (when not
/// null) the profile, the devices and the plan. `tied`: the embedding and head share a matrix.
PipelinePlan plan_from_profile(const std::vector<PipelineBlockCost>& blocks, const Config& cfg, int64_t seq_len,
                               const std::vector<PipelineDevice>& devices, bool tied, std::string* table);

/// dist.pipeline_cut as stage ends (the last = `blocks`) for dist.pipeline_stages stages, or with
/// auto for as many as it names; "even" for equal Block counts; none when it is empty. UserError naming the fix for a
/// bad one.
std::optional<std::vector<int64_t>> configured_pipeline_cut(const DistConfig& dist, int64_t blocks);

/// Each stage's end Block (ascending, the last = the Block count): dist.pipeline_cut when given,
/// validated against the stage count (dist.pipeline_stages, or with auto its length + 1), else
/// plan_pipeline's cut (which fills *table). UserError naming the fix for a bad cut.
std::vector<int64_t> pipeline_stage_ends(Model& model, const Config& cfg, int64_t seq_len,
                                         const std::vector<PipelineDevice>& devices, std::string* table);

}  // namespace tandem
