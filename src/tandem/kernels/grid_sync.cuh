#pragma once
// Barriers of a persistent kernel (Note [Persistent decode step]): a named barrier over some warps
// of a block, and a barrier over every block of a grid whose blocks are all resident at once (a
// cooperative launch). Loads of data that other blocks write during the kernel go through L2
// (`coherent_load`), never through L1 or the read-only path, which may hold an older copy.

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::detail {

/// Waits for `threads` threads (a multiple of 32) of this block at barrier `id` (1-15; 0 is
/// __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// *p read from L2 (data another block of the grid may have written).
template <class V>
__device__ __forceinline__ V coherent_load(const V* p) {
  return __ldcg(p);
}

/// A barrier over the `blocks` blocks of the grid, each taking part with the same `threads`
/// threads (named barrier `id`); `count` is a zeroed word of global memory that every block's
/// barriers count on, and `target` this thread's count of the arrivals passed so far (start at 0).
/// What a block wrote before it is visible to every block after it: the block's threads meet, one of
/// them adds its arrival with release semantics and reads the count with acquire semantics until
/// every block has arrived, and the block's threads meet again.
struct GridBarrier {
  unsigned* count;
  unsigned blocks;
  unsigned target = 0;

  __device__ __forceinline__ void sync(int tid, int id, int threads) {
    named_barrier(id, threads);
    target += blocks;
    if (tid == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
      } while (seen < target);
    }
    named_barrier(id, threads);
  }
};

}  // namespace tandem::detail
