#pragma once
// The offload memory plan for a model tandem did not build (Note [Module plan]): from the Blocks'
// sizes, the host ring, the host's floor, the first update split and its range, and the range
// widened once the peak of the first steps is measured.

#include <c10/core/Device.h>

#include <cstdint>
#include <utility>

#include "tandem/core/config.h"
#include "tandem/python/module_blocks.h"

namespace tandem {

/// This rank's share of the host, for a module's plan.
struct HostShare {
  int64_t available = 0;        ///< bytes: offload.host_memory_gib, or MemAvailable / ranks on the host
  int64_t reclaimable = 0;      ///< bytes of the model's parameters on the host the store frees as it binds them
  int shards = 1;               ///< the ZeRO-2 ranks sharing the masters and states
  bool device_is_host = false;  ///< the CPU as the device: the device side's buffers are host memory too
};

/// The host side of the plan for the split `gpu_blocks` (Note [Module plan]): offload.host_ring=auto
/// resolved in `cfg` (per-Block buffers when those of the CPU-updated Blocks fit, else a ring of 4
/// slots, updating after the norm). Returns the fewest GPU-updated Blocks whose host side fits, the
/// solver's lower bound. UserError when the host cannot hold even the masters and states.
int64_t plan_module_host(Config& cfg, const ModuleBlocks& blocks, const HostShare& host, int64_t gpu_blocks);

/// The first split and the range the solver may move in: {store Blocks GPU-updated first, the
/// most that fit}. UserError when the user's k does not fit.
std::pair<int64_t, int64_t> plan_module_split(const Config& cfg, const ModuleBlocks& blocks, const c10::Device& device);

/// The most store Blocks the device may update given the peak measured so far: the Blocks after
/// the first `gpu_blocks` whose masters and states (Note [Device Adam]) fit what the peak left free
/// of cfg's offload.gpu_memory_fraction of the device.
int64_t measured_split_limit(const Config& cfg, const ModuleBlocks& blocks, int64_t gpu_blocks, int device_index);

}  // namespace tandem
