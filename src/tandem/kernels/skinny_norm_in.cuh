#pragma once
// The norm a skinny product computes for its own input (Note [Norm in the product]): each block
// forms the fused norm of the step's rows into shared memory, then the product's warps dot their
// weight rows with it.

#include <cuda_runtime.h>

#include <cstdint>

#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/decode_fusions.cuh"
#include "tandem/kernels/decode_fusions_launch.h"
#include "tandem/kernels/dependent_launch.cuh"
#include "tandem/kernels/skinny_rows.cuh"

namespace tandem::detail {

/// Waits for the kernels ahead, then writes the fused norm of ROWS rows (launch_add_rms_norm's
/// arithmetic on n, a of type T or null, out unused) into xs (ROWS x n.C of T, shared memory), the
/// block's kSkinnyWarps warps playing the norm's kNormThreads threads and loading r's elements
/// again for the second pass (their weight pieces stay in flight meanwhile); block 0 alone stores
/// r = x + a. Every thread of the block calls it; the block is synced when it returns.
template <class T, int ROWS>
__device__ __forceinline__ void norm_rows_into(const NormArgs& n, T* xs, float* partial) {
  wait_for_prior_grids();
  const int C = static_cast<int>(n.C);
  const T* a = static_cast<const T*>(n.a);
#pragma unroll
  for (int row = 0; row < ROWS; ++row) {
    const float* x = n.x + int64_t{row} * C;
    const T* ar = a == nullptr ? nullptr : a + int64_t{row} * C;
    float* r = n.r != nullptr && blockIdx.x == 0 ? n.r + int64_t{row} * C : nullptr;
    add_rms_norm_row_on<32 * kSkinnyWarps, false>(
        [&](int i, float* v) { load4(x + i, v); }, [&](int i, float* v) { load4(ar + i, v); }, ar != nullptr, r, n.w,
        xs + int64_t{row} * C, C, n.eps, n.plus_one, static_cast<int>(threadIdx.x), partial, [] { __syncthreads(); });
    __syncthreads();
  }
}

/// warp_dots of the ROWS rows of x, or (NORMED) of the norm that `norm` describes, formed by the
/// block into its dynamic shared memory (ROWS x K of T) once the first weights are asked for. With
/// NORMED every warp of the block calls it, those past the product's end on a row of their own.
template <class T, int ROWS, int WROWS, int IN_FLIGHT, bool NORMED>
__device__ __forceinline__ void product_dots(const NormArgs& norm, const T* x, const T* const (&w)[WROWS], int64_t K,
                                             int lane, float (&sum)[WROWS][ROWS]) {
  if constexpr (NORMED) {
    extern __shared__ uint4 normed_rows[];
    __shared__ float partial[kNormThreads / 32];
    T* xs = reinterpret_cast<T*>(normed_rows);
    warp_dots_after<T, ROWS, WROWS, IN_FLIGHT, true>(xs, w, K, lane, sum,
                                                     [&] { norm_rows_into<T, ROWS>(norm, xs, partial); });
  } else {
    warp_dots<T, ROWS, WROWS, IN_FLIGHT>(x, w, K, lane, sum);
  }
}

}  // namespace tandem::detail
