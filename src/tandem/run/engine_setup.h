#pragma once
// The offload engine from a run plan (Note [ParamStore layout], Note [Update split]): the memory
// plan that chooses the update split and the host ring before anything is allocated, the
// parameter store's and the engine's options from the config, and the pieces built over a model.

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "tandem/core/config.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/memory/plan.h"
#include "tandem/models/spec.h"
#include "tandem/parallel/rank_info.h"

namespace tandem {

class BlockSequence;
class Model;
class ParamStore;
class PlacementDriver;
struct RunContext;
struct RunPlan;

/// How many store Blocks of this rank's (a prefix: the embedding, then decoder layers) the device
/// updates, from the memory plan of the rank's `layout` (Note [Plan layout]) checked against this machine
/// (offload.update_split, or the largest prefix that fits); resolves offload.host_ring in `cfg`. `range` receives the
/// prefixes whose plans fit both tiers: the split solver's range. UserError when no plan fits.
int64_t plan_gpu_blocks(const ModelSpec& spec, Config& cfg, int64_t seq_len, const c10::Device& device,
                        std::pair<int64_t, int64_t>* range, const RankInfo& ranks, const PlanLayout& layout);

/// The offload plan of the first replica of this rank's stage (rank 0's without a pipeline) on every
/// replica (the split, its range and offload.host_ring): the replicas' collectives must match Block
/// for Block. The NVMe tier turns speculation off (Note [NVMe tier]); a ring speculates without an
/// undo log (Note [Retraction]).
void agree_on_offload_plan(const RunContext& ctx, int64_t& gpu_blocks, std::pair<int64_t, int64_t>& range,
                           OffloadConfig& offload, const PlanLayout& layout = {});

/// The engine's options for a config (AdamW from optim.*, clipping, speculation, delayed update, the
/// split's range `split_range` in store Blocks, the trace under `run_dir`), for this rank.
/// `trace_counters` fills the trace's counter tracks.
EngineOptions engine_options(const Config& cfg, std::pair<int64_t, int64_t> split_range, const std::string& run_dir,
                             const RunContext& ctx, decltype(EngineOptions::trace_counters) trace_counters);
/// The same for a run plan (its config, split range and run directory).
EngineOptions engine_options(const RunPlan& plan, const RunContext& ctx,
                             decltype(EngineOptions::trace_counters) trace_counters);
/// The parameter store's options for a config: compute dtype from train.precision, pinned buffers,
/// host state dtype, host ring, undo log, and the ZeRO-2 shard of this rank.
ParamStoreOptions store_options(const Config& cfg, const RunContext& ctx);

/// The offload engine's pieces over a model: its parameter store, the engine, and the placement
/// driver when placement.policy is on.
struct OffloadParts {
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<OffloadEngine> engine;
  std::unique_ptr<PlacementDriver> placement;
  OffloadParts();
  OffloadParts(OffloadParts&&) noexcept;
  OffloadParts& operator=(OffloadParts&&) noexcept;
  ~OffloadParts();
};

/// What the offload engine is built from besides the model: the config, the memory plan's split
/// (store Blocks the device updates first, and the range the solver may move in) and the run directory.
struct OffloadSetup {
  const Config& cfg;
  int64_t gpu_blocks = 0;
  std::pair<int64_t, int64_t> split_range{0, 0};
  std::string run_dir;
};

/// Builds the store (the model's parameters become views of its host masters), the engine and
/// the placement driver over any BlockSequence (Note [Block sequence]); `build_s` is the model's
/// build time, for the log.
OffloadParts build_offload(BlockSequence& blocks, const OffloadSetup& setup, const RunContext& ctx,
                           decltype(EngineOptions::trace_counters) trace_counters, double build_s);
/// A preset's: its buffers (RoPE tables) move to the device, its parameters stay as the masters.
OffloadParts build_offload(Model& model, const RunPlan& plan, const RunContext& ctx,
                           decltype(EngineOptions::trace_counters) trace_counters, double build_s);

}  // namespace tandem
