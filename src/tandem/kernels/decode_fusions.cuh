#pragma once
// The device arithmetic of the decode fusions (Note [Decode fusions]) that other kernels repeat bit
// for bit: the fused norm's row, silu(g) * u and the RoPE rotation. The fusions' own kernels
// (decode_fusions.cu), the skinny products' epilogues (skinny_epilogues.cu) and the persistent
// decode step (decode_step.cu, Note [Persistent decode step]) all compute through these.

#include <cuda_runtime.h>

#include "tandem/kernels/cuda_elements.cuh"

namespace tandem::detail {

/// Threads that compute one row of the fused norm, and the row's elements each holds in registers
/// between its two passes (rows of up to 4 x kNormThreads x kNormHeld elements).
constexpr int kNormThreads = 512;
constexpr int kNormHeld = 4;

/// Four consecutive elements (aligned to four) as floats, and back.
template <class T>
__device__ __forceinline__ void load4(const T* p, float* v) {
  if constexpr (sizeof(T) == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = to_float(e[i]);
  }
}
template <class T>
__device__ __forceinline__ void store4(T* p, const float* v) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    uint2 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) e[i] = from_float<T>(v[i]);
    *reinterpret_cast<uint2*>(p) = raw;
  }
}

/// The sum of v over the kNormThreads threads that call it (tid 0 to kNormThreads - 1), on each of
/// them: warp sums into `partial` (kNormThreads / 32 floats of shared memory), `sync()` a barrier
/// of those threads, then the warps' sums in order.
template <class Sync>
__device__ __forceinline__ float norm_block_sum(float v, float* partial, int tid, Sync sync) {
  v = warp_sum(v);
  if (tid % 32 == 0) partial[tid / 32] = v;
  sync();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  return total;
}

/// Thread tid's part of one row of the fused norm (C elements, a multiple of 4): r = x + a (x alone
/// without a), stored into r where r is given, then out = cast(r / rms(r) * scale), the scale w or
/// 1 + w. load_x(i, v) and load_a(i, v) give elements i to i + 3 as floats; w is fp32.
template <class TO, class LoadX, class LoadA, class Sync>
__device__ __forceinline__ void add_rms_norm_row(LoadX load_x, LoadA load_a, bool has_a, float* r, const float* w,
                                                 TO* out, int C, float eps, bool plus_one, int tid, float* partial,
                                                 Sync sync) {
  constexpr int step = 4 * kNormThreads;
  float held[kNormHeld][4];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormHeld; ++k) {
    const int i = k * step + 4 * tid;
    if (i >= C) break;
    load_x(i, held[k]);
    if (has_a) {
      float av[4];
      load_a(i, av);
#pragma unroll
      for (int j = 0; j < 4; ++j) held[k][j] = __fadd_rn(held[k][j], av[j]);
    }
    if (r != nullptr) store4(r + i, held[k]);
#pragma unroll
    for (int j = 0; j < 4; ++j) ss = fmaf(held[k][j], held[k][j], ss);
  }
  const float inv = rsqrtf(norm_block_sum(ss, partial, tid, sync) / static_cast<float>(C) + eps);
#pragma unroll
  for (int k = 0; k < kNormHeld; ++k) {
    const int i = k * step + 4 * tid;
    if (i >= C) break;
    float s[4], o[4];
    load4(w + i, s);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float scale = plus_one ? __fadd_rn(1.0f, s[j]) : s[j];
      o[j] = __fmul_rn(__fmul_rn(held[k][j], inv), scale);
    }
    store4(out + i, o);
  }
}

/// silu(g) rounded to T (torch's silu: g / (1 + exp(-g)) in fp32), times u: the fused activation
/// before its rounding to T.
template <class T>
__device__ __forceinline__ float silu_times(float g, float u) {
  const float act = round_to<T>(g / (1.0f + expf(-g)));
  return __fmul_rn(act, u);
}

/// One rotated element of RoPE in rotate-half form: v cos + partner sin, each product and the sum
/// rounded as separate ops in T store them (partner is -x[d + rotary / 2] for d in the first half,
/// x[d - rotary / 2] in the second).
template <class T>
__device__ __forceinline__ float rotated(float v, float partner, float cos, float sin) {
  return __fadd_rn(round_to<T>(__fmul_rn(v, cos)), round_to<T>(__fmul_rn(partner, sin)));
}

}  // namespace tandem::detail
