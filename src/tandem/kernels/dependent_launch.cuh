#pragma once
// Programmatic dependent launch for the decode kernels: the device side's wait and release, and the
// launcher. See Note [Dependent launch].

#include <cuda_runtime.h>

#include <utility>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/dependent_launch.h"

// Note [Dependent launch]
// A batch-1 decode step of a 1B model is about 200 kernels of a few microseconds each; between two
// of them the GPU drains the first, launches the second and waits for its first loads, and the
// step ran at 46 % of its weight-read bound on an H100 with every kernel's own time near the
// bandwidth (docs/benchmarks.md). Hopper's programmatic dependent launch lets a kernel start while
// the one ahead of it on the stream still runs: each decode kernel (the skinny linear, the norms,
// RoPE with the cache writes, silu * up, the paged attention and its combine) releases its
// dependents as it starts (`release_dependents`), and waits for the kernels ahead of it to finish,
// their writes visible, before it reads or writes anything they touch (`wait_for_prior_grids`).
// Before that wait only the skinny products run: each lane loads its first pieces of its weight rows
// into registers (warp_dots in kernels/skinny_rows.cuh), which no kernel writes, so a product's first
// loads overlap the end of the kernel before it: 5-6 % off a 1B model's batch-1 decode step on an
// H100, 1 % off a 7B one's (docs/benchmarks.md). (The skinny linear once asked L2 for whole weight
// rows there instead, at most a third of L2 between the warps that start at once: the decode steps
// ran slower with it, 1.45 against 1.30-1.33 ms at 1B, 5.81-5.83 against 5.59 ms at 7B; the
// prefetched lines displaced the running product's.) The wait makes the order transitive (a kernel's wait ends
// after the one ahead of it ended, which waited for its own), and a kernel launched the ordinary way
// (LibTorch's, a copy) waits for the whole of the one ahead of it. Recorded decode steps keep the
// edges (CUDA graphs capture them). Every kernel launched through `launch_dependent` must call
// `wait_for_prior_grids` before its first dependent access; on GPUs before compute capability 9.0
// the attribute is left off and both calls compile to nothing. TANDEM_DEPENDENT_LAUNCH=off launches
// them the ordinary way (kernels/dependent_launch.h).

namespace tandem::detail {

/// Lets the next kernel on the stream launch now; it still waits for this one at its own
/// wait_for_prior_grids.
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Waits until the kernels ahead of this one on the stream have ended and their writes are visible.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the kernel ahead of
/// it on the stream where dependent_launch_on_current_device(); checked.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = dependent_launch_on_current_device() ? 1 : 0;
  TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace tandem::detail
