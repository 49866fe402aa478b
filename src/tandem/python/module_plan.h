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

/// offload.host_ring=auto resolved in `cfg` (per-Block buffers when they fit the host, else a ring
/// of 4 slots, updating after the norm); UserError when the host cannot hold even the masters and
/// states. `host_bytes` is this rank's share of the host, `shards` the ZeRO-2 ranks sharing them.
void plan_module_host(Config& cfg, const ModuleBlocks& blocks, int64_t host_bytes, int shards);

/// The first split and the range the solver may move in: {store Blocks GPU-updated first, the
/// most that fit}. UserError when the user's k does not fit.
std::pair<int64_t, int64_t> plan_module_split(const Config& cfg, const ModuleBlocks& blocks, const c10::Device& device);

/// The most store Blocks the device may update given the peak measured so far: the Blocks after
/// the first `gpu_blocks` whose states fit what the peak left free.
int64_t measured_split_limit(const ModuleBlocks& blocks, int64_t gpu_blocks, int device_index);

}  // namespace tandem
