// The device-side Adam kernel (Note [Device Adam]): the CPU kernels' arithmetic, operation for
// operation, each rounded once (no contraction into fused multiply-adds the CPU does not make).

#include <cuda_runtime.h>

#include "tandem/kernels/bf16_rounding.h"
#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/device_adam_launch.h"
#include "tandem/kernels/device_facts.h"

namespace tandem::detail {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __uint_as_float(uint32_t{reinterpret_cast<const uint16_t*>(p)[i]} << 16);
}

__device__ __forceinline__ void store_state(float* p, int64_t i, float x, const DeviceAdamCoeffs&, uint32_t, uint32_t) {
  p[i] = x;
}
__device__ __forceinline__ void store_state(__nv_bfloat16* p, int64_t i, float x, const DeviceAdamCoeffs& c,
                                            uint32_t idx, uint32_t seed) {
  reinterpret_cast<uint16_t*>(p)[i] =
      c.stochastic ? f32_to_bf16_bits(x, random_bits(idx, seed), false) : f32_to_bf16_bits(x, 0, true);
}

__device__ __forceinline__ void store_out(float* p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void store_out(__half* p, int64_t i, float x) { p[i] = __float2half_rn(x); }
__device__ __forceinline__ void store_out(__nv_bfloat16* p, int64_t i, float x) {
  reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(x, 0, true);
}

template <class GT, class ST, class OT>
__global__ void __launch_bounds__(kThreads)
    device_adam_kernel(float* __restrict__ master, const GT* __restrict__ grad, ST* __restrict__ m, ST* __restrict__ v,
                       OT* __restrict__ out, int64_t n, uint64_t index_base, DeviceAdamCoeffs c) {
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += stride) {
    const uint32_t idx = static_cast<uint32_t>(index_base + static_cast<uint64_t>(i));
    float p = master[i];
    float g = __fmul_rn(load(grad, i), c.grad_scale);
    if (c.decoupled)
      p = __fmul_rn(p, c.decay);
    else
      g = __fadd_rn(g, __fmul_rn(c.wd, p));
    const float mi = __fmaf_rn(c.omb1, g, __fmul_rn(c.b1, load(m, i)));
    const float vi = __fmaf_rn(__fmul_rn(c.omb2, g), g, __fmul_rn(c.b2, load(v, i)));
    const float denom = __fmaf_rn(__fsqrt_rn(vi), c.inv_sqrt_bc2, c.eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(c.neg_step_size, mi), denom));
    store_state(m, i, mi, c, idx, c.seed);
    store_state(v, i, vi, c, idx, c.seed ^ kSecondStateSeed);
    master[i] = p;
    if (out != nullptr) store_out(out, i, p);
  }
}

template <class GT, class ST, class OT>
void launch(const DeviceAdamSpan& s, const DeviceAdamCoeffs& c, cudaStream_t stream) {
  const int64_t want = (s.n + kThreads - 1) / kThreads, most = int64_t{multiprocessor_count()} * 8;
  const auto blocks = static_cast<unsigned>(want < most ? want : most);
  device_adam_kernel<GT, ST, OT><<<blocks, kThreads, 0, stream>>>(s.master, static_cast<const GT*>(s.grad),
                                                                  static_cast<ST*>(s.m), static_cast<ST*>(s.v),
                                                                  static_cast<OT*>(s.out), s.n, s.index_base, c);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_device_adam(const DeviceAdamSpan& s, const DeviceAdamCoeffs& c, ElementType grad_type,
                        ElementType state_type, ElementType out_type, cudaStream_t stream) {
  if (s.n == 0) return;
  with_element_type(grad_type, [&](auto g) {
    using GT = decltype(g);
    with_element_type(out_type, [&](auto o) {
      using OT = decltype(o);
      if (state_type == ElementType::kBF16)
        launch<GT, __nv_bfloat16, OT>(s, c, stream);
      else
        launch<GT, float, OT>(s, c, stream);
    });
  });
}

}  // namespace tandem::detail
