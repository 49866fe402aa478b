#pragma once
// Facts of the current CUDA device that kernel launchers size their grids by, asked of the runtime
// once per device (kernels/device_facts_cuda.cpp; CUDA builds only). No CUDA headers here.

namespace tandem::detail {

/// The current device's streaming multiprocessors.
int multiprocessor_count();

/// The current device's compute capability, its major number (9 for Hopper).
int compute_capability_major();

/// The most shared memory one block of the current device may ask for (its opt-in limit), in bytes.
int max_shared_per_block();

}  // namespace tandem::detail
