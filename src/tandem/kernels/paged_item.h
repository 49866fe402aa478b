#pragma once
// The unit of work of paged decode attention (Note [Paged decode attention]): one (sequence,
// key/value head, split of the keys), the warps that compute it and the shared memory it takes.
// Plain C++: the persistent decode step's planner (kernels/decode_step_plan.h) sizes by it too.

#include <cstdint>

#include "tandem/kernels/host_device.h"

namespace tandem::detail {

/// Warps that compute one item.
constexpr int kPagedWarps = 4;

/// Floats of shared memory one item takes with gs query heads a key/value head (at least the
/// model's) of hd dimensions: their scaled queries, and each warp's maxima, sums and weighted values.
TANDEM_HOST_DEVICE constexpr int64_t paged_item_floats(int64_t gs, int64_t hd) {
  return gs * hd * (1 + kPagedWarps) + 2 * kPagedWarps * gs;
}

}  // namespace tandem::detail
