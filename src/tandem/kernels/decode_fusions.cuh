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

/// Thread tid's part of one row of the fused norm (C elements, a multiple of 4) on a block of
/// THREADS threads (a divisor of kNormThreads): r = x + a (x alone without a), stored into r where r
/// is given, then out = cast(r / rms(r) * scale), the scale w or 1 + w. Each thread plays the
/// kNormThreads / THREADS threads tid, tid + THREADS, ... of the kNormThreads-thread norm, whose
/// sums it forms in that norm's order (each warp's sum, then the warps' sums in order), so the
/// result has the same bits on any THREADS. HOLD keeps r's elements in registers between the two
/// passes; without it the second pass loads and adds them again (the same bits, fewer registers
/// held across the barrier, for a caller that keeps its own in flight). load_x(i, v) and load_a(i,
/// v) give elements i to i + 3 as floats; w is fp32; `partial` holds kNormThreads / 32 floats,
/// `sync()` is a barrier of the THREADS threads, and the caller syncs again before `partial` is used
/// for another row.
template <int THREADS, bool HOLD, class TO, class LoadX, class LoadA, class Sync>
__device__ __forceinline__ void add_rms_norm_row_on(LoadX load_x, LoadA load_a, bool has_a, float* r, const float* w,
                                                    TO* out, int C, float eps, bool plus_one, int tid, float* partial,
                                                    Sync sync) {
  static_assert(kNormThreads % THREADS == 0 && THREADS % 32 == 0, "a block of whole warps dividing the norm's");
  constexpr int plays = kNormThreads / THREADS;
  constexpr int step = 4 * kNormThreads;
  constexpr int held_n = HOLD ? kNormHeld : 1;
  const auto sum_at = [&](int i, float* v) {  // r's elements i to i + 3
    load_x(i, v);
    if (has_a) {
      float av[4];
      load_a(i, av);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = __fadd_rn(v[j], av[j]);
    }
  };
  float held[plays][held_n][4];
  float ss[plays];
#pragma unroll
  for (int p = 0; p < plays; ++p) {
    const int t = tid + p * THREADS;
    ss[p] = 0.0f;
#pragma unroll
    for (int k = 0; k < kNormHeld; ++k) {
      const int i = k * step + 4 * t;
      if (i >= C) break;
      float* v = held[p][HOLD ? k : 0];
      sum_at(i, v);
      if (r != nullptr) store4(r + i, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) ss[p] = fmaf(v[j], v[j], ss[p]);
    }
  }
#pragma unroll
  for (int p = 0; p < plays; ++p) {
    const float v = warp_sum(ss[p]);
    if (tid % 32 == 0) partial[(tid + p * THREADS) / 32] = v;
  }
  sync();
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormThreads / 32; ++k) total += partial[k];
  const float inv = rsqrtf(total / static_cast<float>(C) + eps);
#pragma unroll
  for (int p = 0; p < plays; ++p) {
    const int t = tid + p * THREADS;
#pragma unroll
    for (int k = 0; k < kNormHeld; ++k) {
      const int i = k * step + 4 * t;
      if (i >= C) break;
      float* v = held[p][HOLD ? k : 0];
      if (!HOLD) sum_at(i, v);
      float s[4], o[4];
      load4(w + i, s);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float scale = plus_one ? __fadd_rn(1.0f, s[j]) : s[j];
        o[j] = __fmul_rn(__fmul_rn(v[j], inv), scale);
      }
      store4(out + i, o);
    }
  }
}

/// add_rms_norm_row_on for a block of kNormThreads threads (tid 0 to kNormThreads - 1).
template <class TO, class LoadX, class LoadA, class Sync>
__device__ __forceinline__ void add_rms_norm_row(LoadX load_x, LoadA load_a, bool has_a, float* r, const float* w,
                                                 TO* out, int C, float eps, bool plus_one, int tid, float* partial,
                                                 Sync sync) {
  add_rms_norm_row_on<kNormThreads, true>(load_x, load_a, has_a, r, w, out, C, eps, plus_one, tid, partial, sync);
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
