#pragma once
// Device helpers shared by the CUDA kernels: conversions between the element types and fp32, warp
// reductions, and a launch switch over ElementType.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tandem/kernels/element_type.h"

namespace tandem::detail {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/// fp32 to T, rounded to nearest even.
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// x rounded to T's precision, as an fp32 value: what an op in T would have stored.
template <class T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

/// Every lane of a full warp.
constexpr unsigned kFullWarp = 0xffffffffu;

/// The sum of x over the 32 lanes of a warp, on every lane.
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullWarp, x, o);
  return x;
}

/// The largest x of the 32 lanes of a warp, on every lane.
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, o));
  return x;
}

/// Calls f(T{}) with T the C++ type of `e`.
template <class F>
void with_element_type(ElementType e, F&& f) {
  switch (e) {
    case ElementType::kF32:
      return f(float{});
    case ElementType::kF16:
      return f(__half{});
    case ElementType::kBF16:
      return f(__nv_bfloat16{});
  }
}

}  // namespace tandem::detail
