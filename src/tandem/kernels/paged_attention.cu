// Paged decode-attention CUDA kernels (Note [Paged decode attention]), launched as dependents (Note
// [Dependent launch]).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/dependent_launch.cuh"
#include "tandem/kernels/paged_attention_launch.h"

namespace tandem::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kPrefetch = 4;  // value rows a lane has in flight
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

// N consecutive elements at p (aligned to their size, or to 16 bytes beyond) as floats.
template <class T, int N>
__device__ __forceinline__ void load_floats(const T* p, float* out) {
  constexpr int bytes = N * static_cast<int>(sizeof(T));
  if constexpr (bytes % 16 == 0) {
    constexpr int per = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < bytes / 16; ++c) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p) + c);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < per; ++i) out[c * per + i] = to_float(e[i]);
    }
  } else if constexpr (bytes == 8) {
    const uint2 raw = __ldg(reinterpret_cast<const uint2*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
  } else if constexpr (bytes == 4) {
    const unsigned raw = __ldg(reinterpret_cast<const unsigned*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

// exp2(x - m), 0 where x is -inf (m is then finite, or the term is dropped by the caller).
__device__ __forceinline__ float weight(float x, float m) { return x == -INFINITY ? 0.0f : exp2f(x - m); }

// One warp's running softmax over the keys it has seen, for each of the block's query heads: the
// maximum score m, the sum of exp2(score - m) l, and the values weighted by them (E dimensions a lane).
template <int G_MAX, int E>
struct WarpSoftmax {
  float m[G_MAX], l[G_MAX], acc[G_MAX][E];

  __device__ __forceinline__ WarpSoftmax() {
#pragma unroll
    for (int g = 0; g < G_MAX; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
    }
  }

  // Takes a tile's scores (a lane's key each, -inf where none; lane 0's is real, so the new maximum
  // is finite) and turns s into the keys' weights under the new maximum.
  __device__ __forceinline__ void rescale(float (&s)[G_MAX], int G) {
#pragma unroll
    for (int g = 0; g < G_MAX; ++g) {
      if (g >= G) continue;
      const float m_new = fmaxf(m[g], warp_max(s[g]));
      const float alpha = weight(m[g], m_new);
      s[g] = weight(s[g], m_new);
      l[g] = l[g] * alpha + warp_sum(s[g]);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] *= alpha;
      m[g] = m_new;
    }
  }

  // Adds the tile's n values (key kk's row at element offset `off` of lane kk), weighted by s,
  // kPrefetch rows loaded before any is used: at small batches the loop waits on the loads' latency.
  template <class T>
  __device__ __forceinline__ void add_values(const T* vc, int64_t off, const float (&s)[G_MAX], int n, int G,
                                             int lane) {
    for (int k0 = 0; k0 < n; k0 += kPrefetch) {
      float v[kPrefetch][E];
#pragma unroll
      for (int u = 0; u < kPrefetch; ++u) {
        const int64_t row = __shfl_sync(kFullWarp, off, (k0 + u) & 31);
        if (k0 + u < n) {
          load_floats<T, E>(vc + row + lane * E, v[u]);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) v[u][e] = 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kPrefetch; ++u)
#pragma unroll
        for (int g = 0; g < G_MAX; ++g) {
          const float p = __shfl_sync(kFullWarp, s[g], (k0 + u) & 31);
          if (g < G) {
#pragma unroll
            for (int e = 0; e < E; ++e) acc[g][e] = fmaf(p, v[u][e], acc[g][e]);
          }
        }
    }
  }
};

// The scores of the key whose row starts at element `off` against the block's G query heads (in
// shared memory, already scaled into log2 units).
template <class T, int HD, int G_MAX>
__device__ __forceinline__ void key_scores(const float (&q_s)[G_MAX][HD], const T* key, int G, float (&s)[G_MAX]) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
#pragma unroll
  for (int g = 0; g < G_MAX; ++g) s[g] = 0.0f;
#pragma unroll 4
  for (int c = 0; c < HD / VEC; ++c) {
    float k[VEC];
    load_floats<T, VEC>(key + c * VEC, k);
#pragma unroll
    for (int g = 0; g < G_MAX; ++g)
      if (g < G) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) s[g] = fmaf(q_s[g][c * VEC + i], k[i], s[g]);
      }
  }
}

// The block's result from its warps' softmaxes (in shared memory): the output rows, or with several
// splits the unnormalised sums, the maximum and the sum of weights for the combining kernel.
template <class T, int HD, int G_MAX>
__device__ void write_block(const PagedDecodeArgs& a, const float (&red_m)[kWarps][G_MAX],
                            const float (&red_l)[kWarps][G_MAX], const float (&red_acc)[kWarps][G_MAX][HD], int64_t b,
                            int64_t kvh, int split, int G) {
  for (int i = static_cast<int>(threadIdx.x); i < G * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, red_m[w][g]);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = weight(red_m[w][g], M);
        L = fmaf(red_l[w][g], f, L);
        A = fmaf(red_acc[w][g][d], f, A);
      }
    }
    const int64_t h = kvh * G + g;
    if (a.splits == 1) {
      static_cast<T*>(a.out)[(b * a.H + h) * HD + d] = from_float<T>(L > 0.0f ? A / L : 0.0f);
    } else {
      float* p = a.partial + ((b * a.H + h) * a.splits + split) * (HD + 2);
      p[d] = A;
      if (d == 0) p[HD] = M, p[HD + 1] = L;
    }
  }
}

// One block per (sequence, key/value head, split); G_MAX >= the query heads per key/value head.
// Each warp takes 32 keys at a time, a lane a key.
template <class T, int HD, int G_MAX>
__global__ void __launch_bounds__(kThreads) paged_decode_kernel(const PagedDecodeArgs a) {
  release_dependents();
  wait_for_prior_grids();
  constexpr int E = HD / 32;  // value dimensions a lane owns
  __shared__ float q_s[G_MAX][HD];
  __shared__ float red_m[kWarps][G_MAX], red_l[kWarps][G_MAX];
  __shared__ float red_acc[kWarps][G_MAX][HD];
  const int64_t b = blockIdx.x, kvh = blockIdx.y;
  const int split = static_cast<int>(blockIdx.z);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int G = static_cast<int>(a.H / a.KV);
  const T* q = static_cast<const T*>(a.q) + b * a.q_stride_b;
  for (int i = static_cast<int>(threadIdx.x); i < G_MAX * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;  // scores in log2 units
    q_s[g][d] = g < G ? to_float(q[(kvh * G + g) * a.q_stride_h + d]) * (a.scale * kLog2e) : 0.0f;
  }
  __syncthreads();

  const int64_t len = a.lengths[b];
  const int64_t begin = (a.window > 0 ? max(int64_t{0}, len - a.window) : int64_t{0}) + int64_t{split} * a.split_keys;
  const int64_t end = min(len, begin + a.split_keys);
  const int64_t pt = a.page_tokens, page_elems = a.KV * pt * HD, head_off = kvh * pt * HD;
  const int64_t* pages = a.pages + b * a.pages_stride;
  WarpSoftmax<G_MAX, E> sm;
  for (int64_t base = begin + warp * 32; base < end; base += kWarps * 32) {
    const int64_t j = base + lane;
    int64_t off = 0;  // element offset of key j's row in the cache
    float s[G_MAX];
    if (j < end) {
      off = pages[j / pt] * page_elems + head_off + (j % pt) * HD;
      key_scores<T, HD, G_MAX>(q_s, static_cast<const T*>(a.k_cache) + off, G, s);
    } else {
#pragma unroll
      for (int g = 0; g < G_MAX; ++g) s[g] = -INFINITY;
    }
    sm.rescale(s, G);
    sm.add_values(static_cast<const T*>(a.v_cache), off, s, static_cast<int>(min(int64_t{32}, end - base)), G, lane);
  }

#pragma unroll
  for (int g = 0; g < G_MAX; ++g) {
    if (lane == 0) red_m[warp][g] = sm.m[g], red_l[warp][g] = sm.l[g];
#pragma unroll
    for (int e = 0; e < E; ++e) red_acc[warp][g][lane * E + e] = sm.acc[g][e];
  }
  __syncthreads();
  write_block<T, HD, G_MAX>(a, red_m, red_l, red_acc, b, kvh, split, G);
}

// The splits' partial sums of one (sequence, query head) combined: one block, a thread a dimension.
template <class T, int HD>
__global__ void __launch_bounds__(HD) paged_decode_combine(const PagedDecodeArgs a) {
  release_dependents();
  wait_for_prior_grids();
  const int64_t b = blockIdx.x, h = blockIdx.y;
  const int d = static_cast<int>(threadIdx.x);
  const float* p = a.partial + (b * a.H + h) * a.splits * (HD + 2);
  float M = -INFINITY;
  for (int s = 0; s < a.splits; ++s) M = fmaxf(M, p[s * (HD + 2) + HD]);
  float L = 0.0f, A = 0.0f;
  if (M != -INFINITY)
    for (int s = 0; s < a.splits; ++s) {
      const float f = weight(p[s * (HD + 2) + HD], M);
      L = fmaf(p[s * (HD + 2) + HD + 1], f, L);
      A = fmaf(p[s * (HD + 2) + d], f, A);
    }
  static_cast<T*>(a.out)[(b * a.H + h) * HD + d] = from_float<T>(L > 0.0f ? A / L : 0.0f);
}

template <class T, int HD, int G_MAX>
void launch_shape(const PagedDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.B), static_cast<unsigned>(a.KV), static_cast<unsigned>(a.splits));
  launch_dependent(paged_decode_kernel<T, HD, G_MAX>, grid, dim3(kThreads), 0, stream, a);
  if (a.splits > 1)
    launch_dependent(paged_decode_combine<T, HD>, dim3(static_cast<unsigned>(a.B), static_cast<unsigned>(a.H)),
                     dim3(HD), 0, stream, a);
}

template <class T, int HD>
void launch_group(const PagedDecodeArgs& a, cudaStream_t stream) {
  const int64_t G = a.H / a.KV;
  if (G == 1)
    launch_shape<T, HD, 1>(a, stream);
  else if (G <= 4)
    launch_shape<T, HD, 4>(a, stream);
  else
    launch_shape<T, HD, 8>(a, stream);
}

template <class T>
void launch_type(const PagedDecodeArgs& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64:
      return launch_group<T, 64>(a, stream);
    case 128:
      return launch_group<T, 128>(a, stream);
    default:
      return launch_group<T, 256>(a, stream);
  }
}

}  // namespace

bool paged_decode_shape_supported(int64_t head_dim, int64_t group) {
  return (head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 && group <= 8;
}

int paged_decode_splits(int64_t B, int64_t KV, int64_t max_keys, int sm_count, int64_t* split_keys) {
  const int64_t blocks = std::max<int64_t>(1, B * KV);
  const int64_t want = std::max<int64_t>(1, (2 * int64_t{sm_count} + blocks - 1) / blocks);
  const int64_t by_keys = std::max<int64_t>(1, (max_keys + 127) / 128);
  int64_t splits = std::min(want, by_keys);
  int64_t keys = (max_keys + splits - 1) / splits;
  keys = std::max<int64_t>(32, (keys + 31) / 32 * 32);
  splits = (max_keys + keys - 1) / keys;
  *split_keys = keys;
  return static_cast<int>(std::max<int64_t>(1, splits));
}

void launch_paged_decode(const PagedDecodeArgs& a, cudaStream_t stream) {
  if (a.B == 0) return;
  with_element_type(a.elem, [&](auto tag) { launch_type<decltype(tag)>(a, stream); });
}

}  // namespace tandem::detail
