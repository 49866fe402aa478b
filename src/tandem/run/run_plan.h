#pragma once
// The run plan: everything a run decides before it builds anything, resolved once and read-only
// afterwards. The config as this rank runs it (the user's, with the resolutions of Note [Run
// plan]), the architecture, the sequence length, the checkpoint to resume, the run directory and,
// with the offload engine, the update split the memory plan allows.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/memory/plan.h"
#include "tandem/models/spec.h"

namespace tandem {

struct RunContext;

/// What the CLI adds to a config for one invocation.
struct TrainOptions {
  std::string resume;         ///< checkpoint or run directory to continue from
  bool resume_asked = false;  ///< --resume was given (auto may still find no checkpoint: a fresh start)
};

struct RunPlan {
  Config cfg;              ///< the config as this rank runs it (written to config.yaml and hashed into checkpoints)
  ModelSpec spec;          ///< the preset with overrides, or the HF directory's config.json
  int64_t seq_len = 0;     ///< train.seq_len, or min(model.max_seq_len, 2048)
  std::string resume_dir;  ///< the checkpoint to resume; "" = a fresh start
  std::string run_dir;     ///< one directory for every rank, named by rank 0
  bool offload = false;    ///< offload.optimizer=cpu: the offload engine
  /// With the offload engine: the store Blocks (a prefix: embedding, then decoder layers) the
  /// device updates, and the range the split solver may move within (Note [ParamStore layout]).
  int64_t gpu_blocks = 0;
  std::pair<int64_t, int64_t> split_range{0, 0};
  /// The pipeline's stage ends when the config gives the cut (dist.pipeline_cut), else empty; and
  /// this rank's place among the processes (Note [Plan layout]). With the partitioner's cut the
  /// layout is the stage's once settle_stage_plan() has run, and gpu_blocks is -1 until then.
  std::vector<int64_t> stage_ends;
  PlanLayout layout;

  std::string checkpoint_dir() const;  ///< <run_dir>/checkpoints
};

/// A new run directory's name: runs/<date>-<time>-<name>, with -2, -3, ... when that exists.
std::string new_run_dir(const std::string& name);

/// Resolves the plan for `cfg` on this rank: checks that span sections, the architecture, the host
/// fit (Note [Host fit]), the run directory and the memory plan of this rank's layout (its
/// pipeline stage when the cut is known, its data-parallel group), agreed within the stage.
RunPlan resolve_run_plan(Config cfg, const TrainOptions& options, const RunContext& ctx);

/// Once a pipeline's cut is known (`ends`, every rank at once): the memory plan of this rank's
/// stage, when resolve_run_plan could not make it (the partitioner's cut); UserError when it does
/// not fit. Nothing when the plan already has its stage.
void settle_stage_plan(RunPlan& plan, const std::vector<int64_t>& ends, const RunContext& ctx);

}  // namespace tandem
