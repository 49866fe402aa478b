#pragma once
// The offload engine from a run plan (Note [ParamStore layout], Note [Update split]): the memory
// plan that chooses the update split and the host ring before anything is allocated, the
// parameter store's and the engine's options from the config, and the pieces built over a model.

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "tandem/core/config.h"
#include "tandem/dist/rank_info.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/models/spec.h"

namespace tandem {

class Model;
class ParamStore;
class PlacementDriver;
struct RunContext;
struct RunPlan;

/// How many store Blocks (a prefix: the embedding, then decoder layers) the device updates, from
/// the memory plan checked against this machine (offload.update_split, or the largest prefix that
/// fits); resolves offload.host_ring in `cfg`. `range` receives the prefixes whose plans fit both
/// tiers: the split solver's range. UserError when no plan fits.
int64_t plan_gpu_blocks(const ModelSpec& spec, Config& cfg, int64_t seq_len, const c10::Device& device,
                        std::pair<int64_t, int64_t>* range, const RankInfo& ranks);

/// The engine's options for a plan (AdamW from optim.*, clipping, speculation, delayed update, the
/// split's range, the trace), for this rank. `trace_counters` fills the trace's counter tracks.
EngineOptions engine_options(const RunPlan& plan, const RunContext& ctx,
                             decltype(EngineOptions::trace_counters) trace_counters);

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

/// Builds the store (the model's parameters become views of its host masters), the engine and
/// the placement driver; `build_s` is the model's build time, for the log.
OffloadParts build_offload(Model& model, const RunPlan& plan, const RunContext& ctx,
                           decltype(EngineOptions::trace_counters) trace_counters, double build_s);

}  // namespace tandem
