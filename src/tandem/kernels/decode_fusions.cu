// The decode fusions' CUDA kernels (Note [Decode fusions]), launched as dependents (Note [Dependent launch]).

#include <cuda_runtime.h>

#include <algorithm>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/decode_fusions_launch.h"
#include "tandem/kernels/dependent_launch.cuh"

namespace tandem::detail {
namespace {

constexpr int kNormThreads = 512;

// The sum of every thread's v in the block (kNormThreads threads), on every thread.
__device__ float block_sum(float v) {
  __shared__ float partial[kNormThreads / 32];
  v = warp_sum(v);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  return total;
}

// Four consecutive elements (aligned to four) as floats, and back.
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

// One block a row, four elements a thread at a time (C a multiple of 4): r = x + a (written when a
// is given), then the norm of r cast to TO. A row of up to 4 x 512 x kHeld elements stays in
// registers between the two passes.
constexpr int kHeld = 4;
template <class A, class TO>
__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(const NormArgs p) {
  release_dependents();
  wait_for_prior_grids();
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.C;
  const A* a = p.a == nullptr ? nullptr : static_cast<const A*>(p.a) + row * p.C;
  float* r = p.r == nullptr ? nullptr : p.r + row * p.C;
  const int C = static_cast<int>(p.C), step = 4 * kNormThreads;
  float held[kHeld][4];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int i = k * step + 4 * static_cast<int>(threadIdx.x);
    if (i >= C) break;
    load4(x + i, held[k]);
    if (a != nullptr) {
      float av[4];
      load4(a + i, av);
#pragma unroll
      for (int j = 0; j < 4; ++j) held[k][j] = __fadd_rn(held[k][j], av[j]);
      store4(r + i, held[k]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) ss = fmaf(held[k][j], held[k][j], ss);
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(C) + p.eps);
  TO* out = static_cast<TO*>(p.out) + row * p.C;
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int i = k * step + 4 * static_cast<int>(threadIdx.x);
    if (i >= C) break;
    float w[4], o[4];
    load4(p.w + i, w);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float scale = p.plus_one ? __fadd_rn(1.0f, w[j]) : w[j];
      o[j] = __fmul_rn(__fmul_rn(held[k][j], inv), scale);
    }
    store4(out + i, o);
  }
}

// One block per (row, head of q, k or v), a thread per dimension. Each product and the sum rounded
// to T, as apply_rope's separate ops store them.
template <class T>
__global__ void rope_write_kv_kernel(const RopeKvArgs p) {
  release_dependents();
  wait_for_prior_grids();
  const int64_t n = blockIdx.x;
  const int head = static_cast<int>(blockIdx.y), hd = static_cast<int>(p.head_dim), i = static_cast<int>(threadIdx.x);
  const int rot = static_cast<int>(p.rotary), half = rot / 2, H = static_cast<int>(p.H), KV = static_cast<int>(p.KV);
  const T* src = static_cast<const T*>(p.qkv) + n * (H + 2 * KV) * hd + head * hd;
  float v = to_float(src[i]);
  if (head < H + KV && i < rot) {
    const T* cos = static_cast<const T*>(p.cos) + n * rot;
    const T* sin = static_cast<const T*>(p.sin) + n * rot;
    const float partner = i < half ? -to_float(src[i + half]) : to_float(src[i - half]);
    const float a = round_to<T>(__fmul_rn(v, to_float(cos[i])));
    const float b = round_to<T>(__fmul_rn(partner, to_float(sin[i])));
    v = __fadd_rn(a, b);
  }
  const T out = from_float<T>(v);
  if (head < H) {
    static_cast<T*>(p.q_out)[(n * H + head) * hd + i] = out;
    return;
  }
  const int64_t page = p.page[n], slot = p.slot[n];
  if (head < H + KV) {
    const int kh = head - H;
    static_cast<T*>(p.k_out)[(n * KV + kh) * hd + i] = out;
    static_cast<T*>(p.k_cache)[((page * KV + kh) * p.page_tokens + slot) * hd + i] = out;
  } else {
    static_cast<T*>(p.v_cache)[((page * KV + head - H - KV) * p.page_tokens + slot) * hd + i] = out;
  }
}

// silu(g) rounded to T (torch's silu: g / (1 + exp(-g)) in fp32), times u, rounded to T.
template <class T>
__global__ void silu_mul_kernel(const T* gu, T* out, int64_t N, int64_t F) {
  release_dependents();
  wait_for_prior_grids();
  const int64_t total = N * F;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = e / F, f = e % F;
    const float g = to_float(gu[n * 2 * F + f]), u = to_float(gu[n * 2 * F + F + f]);
    const float act = round_to<T>(g / (1.0f + expf(-g)));
    out[e] = from_float<T>(__fmul_rn(act, u));
  }
}

}  // namespace

void launch_add_rms_norm(const NormArgs& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  with_element_type(p.out_elem, [&](auto out_tag) {
    using TO = decltype(out_tag);
    with_element_type(p.a_elem, [&](auto a_tag) {
      launch_dependent(add_rms_norm_kernel<decltype(a_tag), TO>, dim3(static_cast<unsigned>(p.rows)),
                       dim3(kNormThreads), 0, stream, p);
    });
  });
}

void launch_rope_write_kv(const RopeKvArgs& p, cudaStream_t stream) {
  if (p.N == 0) return;
  with_element_type(p.elem, [&](auto tag) {
    const dim3 grid(static_cast<unsigned>(p.N), static_cast<unsigned>(p.H + 2 * p.KV));
    launch_dependent(rope_write_kv_kernel<decltype(tag)>, grid, dim3(static_cast<unsigned>(p.head_dim)), 0, stream, p);
  });
}

void launch_silu_mul(const void* gu, void* out, int64_t N, int64_t F, ElementType elem, cudaStream_t stream) {
  if (N * F == 0) return;
  const int64_t blocks = std::min<int64_t>((N * F + 255) / 256, 4096);
  with_element_type(elem, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent(silu_mul_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream,
                     static_cast<const T*>(gu), static_cast<T*>(out), N, F);
  });
}

}  // namespace tandem::detail
