#pragma once
// The device side of paged decode attention (Note [Paged decode attention]): one work item, a
// (sequence, key/value head, split of the keys), computed by four warps, and the combination of a
// head's splits. The attention kernels (paged_attention.cu) and the persistent decode step
// (decode_step.cu, Note [Persistent decode step]) both compute through these, so their outputs
// have the same bits. `Path` names how global memory is read: ReadOnlyPath where nothing the kernel
// reads is written during it, L2Path where other blocks of the same kernel wrote it.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/paged_attention_launch.h"

namespace tandem::detail {

constexpr int kPagedThreads = 32 * kPagedWarps;
/// Value rows a lane has in flight: 32 floats' worth (16 rows of heads of 64, 8 of 128, 4 of 256). At
/// batch 1 an item's time is mostly these loads' latency, one round trip per group of rows.
constexpr int paged_prefetch(int E) { return 32 / E < 4 ? 4 : (32 / E > 16 ? 16 : 32 / E); }
constexpr float kLog2e = 1.4426950408889634f;

struct ReadOnlyPath {
  template <class V>
  static __device__ __forceinline__ V load(const V* p) {
    return __ldg(p);
  }
};
struct L2Path {
  template <class V>
  static __device__ __forceinline__ V load(const V* p) {
    return __ldcg(p);
  }
};

/// N consecutive elements at p (aligned to their size, or to 16 bytes beyond) as floats.
template <class T, int N, class Path>
__device__ __forceinline__ void load_floats(const T* p, float* out) {
  constexpr int bytes = N * static_cast<int>(sizeof(T));
  if constexpr (bytes % 16 == 0) {
    constexpr int per = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < bytes / 16; ++c) {
      const uint4 raw = Path::load(reinterpret_cast<const uint4*>(p) + c);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < per; ++i) out[c * per + i] = to_float(e[i]);
    }
  } else if constexpr (bytes == 8) {
    const uint2 raw = Path::load(reinterpret_cast<const uint2*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
  } else if constexpr (bytes == 4) {
    const unsigned raw = Path::load(reinterpret_cast<const unsigned*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(Path::load(p + i));
  }
}

/// exp2(x - m), 0 where x is -inf (m is then finite, or the term is dropped by the caller).
__device__ __forceinline__ float softmax_weight(float x, float m) { return x == -INFINITY ? 0.0f : exp2f(x - m); }

/// One warp's running softmax over the keys it has seen, for each of the item's query heads: the
/// maximum score m, the sum of exp2(score - m) l, and the values weighted by them (E dimensions a lane).
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
      const float alpha = softmax_weight(m[g], m_new);
      s[g] = softmax_weight(s[g], m_new);
      l[g] = l[g] * alpha + warp_sum(s[g]);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] *= alpha;
      m[g] = m_new;
    }
  }

  // Adds the tile's n values (key kk's row at element offset `off` of lane kk), weighted by s, in
  // key order, paged_prefetch(E) rows loaded before any is used: at small batches the loop waits on
  // the loads' latency.
  template <class T, class Path>
  __device__ __forceinline__ void add_values(const T* vc, int64_t off, const float (&s)[G_MAX], int n, int G,
                                             int lane) {
    constexpr int kPrefetch = paged_prefetch(E);
    for (int k0 = 0; k0 < n; k0 += kPrefetch) {
      float v[kPrefetch][E];
#pragma unroll
      for (int u = 0; u < kPrefetch; ++u) {
        const int64_t row = __shfl_sync(kFullWarp, off, (k0 + u) & 31);
        if (k0 + u < n) {
          load_floats<T, E, Path>(vc + row + lane * E, v[u]);
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

/// The shared memory of one item's kPagedWarps warps: the query heads' scaled queries (gs rows of HD) and
/// the warps' softmax states (kPagedWarps x gs maxima and sums, kPagedWarps x gs rows of HD sums),
/// gs >= the query heads a key/value head has.
struct PagedItemShared {
  float* q;    // (gs, HD)
  float* m;    // (kPagedWarps, gs)
  float* l;    // (kPagedWarps, gs)
  float* acc;  // (kPagedWarps, gs, HD)
  int gs;

  /// Laid out from `base` (paged_item_floats(gs, hd) floats).
  static __device__ __forceinline__ PagedItemShared at(float* base, int gs, int hd) {
    PagedItemShared s;
    s.gs = gs;
    s.q = base;
    s.m = base + gs * hd;
    s.l = s.m + kPagedWarps * gs;
    s.acc = s.l + kPagedWarps * gs;
    return s;
  }
};

/// The scores of the key whose row starts at `key` against the item's G query heads (in shared
/// memory, already scaled into log2 units).
template <class T, int HD, int G_MAX, class Path>
__device__ __forceinline__ void key_scores(const float* q_s, const T* key, int G, float (&s)[G_MAX]) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
#pragma unroll
  for (int g = 0; g < G_MAX; ++g) s[g] = 0.0f;
#pragma unroll 4
  for (int c = 0; c < HD / VEC; ++c) {
    float k[VEC];
    load_floats<T, VEC, Path>(key + c * VEC, k);
#pragma unroll
    for (int g = 0; g < G_MAX; ++g)
      if (g < G) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) s[g] = fmaf(q_s[g * HD + c * VEC + i], k[i], s[g]);
      }
  }
}

/// The item's result from its warps' softmaxes (in shared memory): the output rows, or with several
/// splits the unnormalised sums, the maximum and the sum of weights for the combination.
template <class T, int HD>
__device__ void write_item(const PagedDecodeArgs& a, const PagedItemShared& sh, int64_t b, int64_t kvh, int split,
                           int G, int tid) {
  for (int i = tid; i < G * HD; i += kPagedThreads) {
    const int g = i / HD, d = i % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kPagedWarps; ++w) M = fmaxf(M, sh.m[w * sh.gs + g]);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kPagedWarps; ++w) {
        const float f = softmax_weight(sh.m[w * sh.gs + g], M);
        L = fmaf(sh.l[w * sh.gs + g], f, L);
        A = fmaf(sh.acc[(w * sh.gs + g) * HD + d], f, A);
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

/// One item (sequence b, key/value head kvh, split) by the kPagedThreads threads tid of four warps;
/// `sync()` is a barrier of those threads. Each warp takes 32 keys at a time, a lane a key.
template <class T, int HD, int G_MAX, class Path, class Sync>
__device__ void paged_decode_item(const PagedDecodeArgs& a, const PagedItemShared& sh, int64_t b, int64_t kvh,
                                  int split, int tid, Sync sync) {
  constexpr int E = HD / 32;  // value dimensions a lane owns
  const int warp = tid / 32, lane = tid % 32;
  const int G = static_cast<int>(a.H / a.KV);
  const T* q = static_cast<const T*>(a.q) + b * a.q_stride_b;
  for (int i = tid; i < sh.gs * HD; i += kPagedThreads) {
    const int g = i / HD, d = i % HD;  // scores in log2 units
    sh.q[i] = g < G ? to_float(Path::load(q + (kvh * G + g) * a.q_stride_h + d)) * (a.scale * kLog2e) : 0.0f;
  }
  sync();

  const int64_t len = a.lengths[b];
  const int64_t begin = (a.window > 0 ? max(int64_t{0}, len - a.window) : int64_t{0}) + int64_t{split} * a.split_keys;
  const int64_t end = min(len, begin + a.split_keys);
  const int64_t pt = a.page_tokens, page_elems = a.KV * pt * HD, head_off = kvh * pt * HD;
  const int64_t* pages = a.pages + b * a.pages_stride;
  WarpSoftmax<G_MAX, E> sm;
  for (int64_t base = begin + warp * 32; base < end; base += kPagedWarps * 32) {
    const int64_t j = base + lane;
    int64_t off = 0;  // element offset of key j's row in the cache
    float s[G_MAX];
    if (j < end) {
      off = pages[j / pt] * page_elems + head_off + (j % pt) * HD;
      key_scores<T, HD, G_MAX, Path>(sh.q, static_cast<const T*>(a.k_cache) + off, G, s);
    } else {
#pragma unroll
      for (int g = 0; g < G_MAX; ++g) s[g] = -INFINITY;
    }
    sm.rescale(s, G);
    sm.template add_values<T, Path>(static_cast<const T*>(a.v_cache), off, s,
                                    static_cast<int>(min(int64_t{32}, end - base)), G, lane);
  }

#pragma unroll
  for (int g = 0; g < G_MAX; ++g) {
    if (g >= sh.gs) break;
    if (lane == 0) sh.m[warp * sh.gs + g] = sm.m[g], sh.l[warp * sh.gs + g] = sm.l[g];
#pragma unroll
    for (int e = 0; e < E; ++e) sh.acc[(warp * sh.gs + g) * HD + lane * E + e] = sm.acc[g][e];
  }
  sync();
  write_item<T, HD>(a, sh, b, kvh, split, G, tid);
}

/// Dimension d of one (sequence, query head) from its splits' partial sums p ((splits, HD + 2)).
template <int HD, class Path>
__device__ __forceinline__ float combined_value(const float* p, int splits, int d) {
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, Path::load(p + s * (HD + 2) + HD));
  float L = 0.0f, A = 0.0f;
  if (M != -INFINITY)
    for (int s = 0; s < splits; ++s) {
      const float f = softmax_weight(Path::load(p + s * (HD + 2) + HD), M);
      L = fmaf(Path::load(p + s * (HD + 2) + HD + 1), f, L);
      A = fmaf(Path::load(p + s * (HD + 2) + d), f, A);
    }
  return L > 0.0f ? A / L : 0.0f;
}

}  // namespace tandem::detail
