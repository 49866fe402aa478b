#pragma once
// Hopper's bulk copies from global into shared memory and the mbarriers that count their bytes:
// the weight stream of the persistent decode step (Note [Persistent decode step]). Compute
// capability 9.0 and up; on earlier GPUs every function compiles to nothing and may not be called.

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::detail {

/// The shared-memory address of p (a pointer into this block's shared memory).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// An mbarrier whose phase completes after `count` arrivals (and the bytes they expect).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
#endif
}

/// Makes the barriers initialised by this thread visible to the copy engine and the other threads
/// (followed by a block-wide barrier).
__device__ __forceinline__ void mbarrier_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/// One arrival that also expects `bytes` more bytes of bulk copies before the phase completes.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#endif
}

/// One arrival.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
#endif
}

/// Waits until the barrier's phase of parity `parity` has completed (the current phase or the one
/// just before it; the caller keeps to that).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}

/// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory into this
/// block's shared memory by the copy engine; their arrival completes on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
#endif
}

}  // namespace tandem::detail
