// The decode fusions' CUDA kernels (Note [Decode fusions]), launched as dependents (Note [Dependent launch]).

#include <cuda_runtime.h>

#include <algorithm>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/decode_fusions.cuh"
#include "tandem/kernels/decode_fusions_launch.h"
#include "tandem/kernels/dependent_launch.cuh"

namespace tandem::detail {
namespace {

// One block a row, four elements a thread at a time (C a multiple of 4): r = x + a (written when a
// is given), then the norm of r cast to TO (add_rms_norm_row).
template <class A, class TO>
__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(const NormArgs p) {
  release_dependents();
  wait_for_prior_grids();
  __shared__ float partial[kNormThreads / 32];
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.C;
  const A* a = p.a == nullptr ? nullptr : static_cast<const A*>(p.a) + row * p.C;
  float* r = p.r == nullptr ? nullptr : p.r + row * p.C;
  add_rms_norm_row([&](int i, float* v) { load4(x + i, v); }, [&](int i, float* v) { load4(a + i, v); }, a != nullptr,
                   r, p.w, static_cast<TO*>(p.out) + row * p.C, static_cast<int>(p.C), p.eps, p.plus_one,
                   static_cast<int>(threadIdx.x), partial, [] { __syncthreads(); });
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
    v = rotated<T>(v, partner, to_float(cos[i]), to_float(sin[i]));
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
    out[e] = from_float<T>(silu_times<T>(g, u));
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
