// BK-core CUDA kernels: the sweeps of Note [BK-core ratio form] as parallel scans, per Note
// [BK-core scan kernels].

#include <cuda_runtime.h>

#include <type_traits>

#include "tandem/kernels/bk_core_launch.h"
#include "tandem/kernels/cuda_check.h"

// Note [BK-core scan kernels]
// One thread per row leaves an H100 idle at any batch below ~10^5 rows, so the kernels cut every
// row into tiles of 512 elements, one warp per tile, 16 consecutive elements per lane (a chunk).
//
// Forward. r_i = d_i - p_{i-1} / r_{i-1} is the ratio x / y of (x, y) pushed through the 2x2
// transfer matrix [[d_i, -p_{i-1}], [1, 0]] (Note [Chunked ratio sweep]); s is the same from the
// far end. Matrix products compose, so:
//   1. tiles pass: each lane multiplies its chunk's matrices (both directions), the warp combines
//      the 32 chunk products with shuffles, and each tile writes its product (a few bytes);
//   2. scan pass: one block per (row, direction) scans the tile products in order and writes the
//      state entering every tile;
//   3. tiles pass again: the same chunk products, an exclusive warp scan seeded with the tile's
//      entering state gives each lane the state entering its chunk, and each lane runs the plain
//      recurrences over its 16 elements and writes G (and r, s when autograd will need them).
// Products are rescaled by powers of two (exact) as they grow; only ratios matter.
//
// Backward. The reverse-mode sweeps of the ratio recursions are linear in the adjoints:
// sbar_{i+1} gains conj(p_i / s_{i+1}^2) sbar_i and rbar_{i-1} gains conj(p_{i-1} / r_{i-1}^2)
// rbar_i, so with qbar as the constant terms they are affine recurrences v -> alpha v + beta, which
// compose the same way. The same three passes run with (alpha, beta) pairs in place of matrices.
//
// Memory traffic. Each tile is loaded once per tiles pass with coalesced loads into shared memory
// (a warp reads 32 consecutive elements per instruction), transposed there into per-lane chunks,
// and written back the same way. The forward reads a, b, c twice (passes 1 and 3) and writes G
// once; the tile products and states add about 2% to that traffic. Without autograd the forward
// keeps no r and s: the backward rebuilds them with one more forward.

namespace tandem::detail {
namespace {

template <class T>
struct alignas(2 * sizeof(T)) Cx {
  T re, im;
};
template <class T>
__device__ __forceinline__ Cx<T> add(Cx<T> x, Cx<T> y) {
  return {x.re + y.re, x.im + y.im};
}
template <class T>
__device__ __forceinline__ Cx<T> sub(Cx<T> x, Cx<T> y) {
  return {x.re - y.re, x.im - y.im};
}
template <class T>
__device__ __forceinline__ Cx<T> mul(Cx<T> x, Cx<T> y) {
  return {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
}
template <class T>
__device__ __forceinline__ Cx<T> scale(Cx<T> x, T k) {
  return {x.re * k, x.im * k};
}
template <class T>
__device__ __forceinline__ Cx<T> conj(Cx<T> x) {
  return {x.re, -x.im};
}
template <class T>
__device__ __forceinline__ Cx<T> inv(Cx<T> y) {
  const T k = T(1) / (y.re * y.re + y.im * y.im);
  return {y.re * k, -y.im * k};
}
template <class T>
__device__ __forceinline__ Cx<T> div(Cx<T> x, Cx<T> y) {
  return mul(x, inv(y));
}
template <class T>
__device__ __forceinline__ T absmax(Cx<T> x) {
  return fmax(fabs(x.re), fabs(x.im));
}

// A power of two k with k m in [1, 2), read off m's exponent bits (exact, a few integer
// instructions); 1 for zero, subnormal, non-finite or extreme m.
template <class T>
__device__ __forceinline__ T pow2_inverse(T m) {
  if constexpr (std::is_same_v<T, float>) {
    const int e = (__float_as_int(m) >> 23) & 0xff;
    return e >= 1 && e <= 253 ? __int_as_float((254 - e) << 23) : 1.f;
  } else {
    const int e = (__double2hiint(m) >> 20) & 0x7ff;
    return e >= 1 && e <= 2045 ? __hiloint2double((2046 - e) << 20, 0) : 1.0;
  }
}

// Shuffles of a struct of T, member by member.
template <class V, class T>
__device__ __forceinline__ V shfl_up(const V& v, int off) {
  constexpr int n = sizeof(V) / sizeof(T);
  V o;
  const T* src = reinterpret_cast<const T*>(&v);
  T* dst = reinterpret_cast<T*>(&o);
#pragma unroll
  for (int k = 0; k < n; ++k) dst[k] = __shfl_up_sync(0xffffffffu, src[k], off);
  return o;
}
template <class V, class T>
__device__ __forceinline__ V shfl_down(const V& v, int off) {
  constexpr int n = sizeof(V) / sizeof(T);
  V o;
  const T* src = reinterpret_cast<const T*>(&v);
  T* dst = reinterpret_cast<T*>(&o);
#pragma unroll
  for (int k = 0; k < n; ++k) dst[k] = __shfl_down_sync(0xffffffffu, src[k], off);
  return o;
}

// The ratio sweep's monoid: 2x2 complex matrices acting on (x, y), the value being x / y.
template <class T>
struct Mobius {
  using Real = T;
  struct Elem {
    Cx<T> m00, m01, m10, m11;
  };
  struct State {
    Cx<T> x, y;
  };
  __device__ static Elem identity() { return {{T(1), T(0)}, {T(0), T(0)}, {T(0), T(0)}, {T(1), T(0)}}; }
  // Before position 0: x / y = infinity, so the first step gives d_0 (its p term is zero).
  __device__ static State init() { return {{T(1), T(0)}, {T(0), T(0)}}; }
  __device__ static Elem rescaled(const Elem& m) {
    const T k = pow2_inverse(fmax(fmax(absmax(m.m00), absmax(m.m01)), fmax(absmax(m.m10), absmax(m.m11))));
    return {scale(m.m00, k), scale(m.m01, k), scale(m.m10, k), scale(m.m11, k)};
  }
  // [[d, -q], [1, 0]] * e, unscaled.
  __device__ static Elem push(Cx<T> d, T q, const Elem& e) {
    return {sub(mul(d, e.m00), scale(e.m10, q)), sub(mul(d, e.m01), scale(e.m11, q)), e.m00, e.m01};
  }
  // later * earlier.
  __device__ static Elem compose(const Elem& l, const Elem& e) {
    return rescaled({add(mul(l.m00, e.m00), mul(l.m01, e.m10)), add(mul(l.m00, e.m01), mul(l.m01, e.m11)),
                     add(mul(l.m10, e.m00), mul(l.m11, e.m10)), add(mul(l.m10, e.m01), mul(l.m11, e.m11))});
  }
  __device__ static State apply(const Elem& m, const State& s) {
    const Cx<T> x = add(mul(m.m00, s.x), mul(m.m01, s.y)), y = add(mul(m.m10, s.x), mul(m.m11, s.y));
    const T k = pow2_inverse(fmax(absmax(x), absmax(y)));
    return {scale(x, k), scale(y, k)};
  }
};

// The adjoint sweep's monoid: v -> a v + b.
template <class T>
struct Affine {
  using Real = T;
  struct Elem {
    Cx<T> a, b;
  };
  struct State {
    Cx<T> v;
  };
  __device__ static Elem identity() { return {{T(1), T(0)}, {T(0), T(0)}}; }
  __device__ static State init() { return {{T(0), T(0)}}; }
  __device__ static Elem push(Cx<T> a, Cx<T> b, const Elem& e) { return {mul(a, e.a), add(mul(a, e.b), b)}; }
  __device__ static Elem compose(const Elem& l, const Elem& e) { return {mul(l.a, e.a), add(mul(l.a, e.b), l.b)}; }
  __device__ static State apply(const Elem& m, const State& s) { return {add(mul(m.a, s.v), m.b)}; }
};

// Inclusive warp scan: in lane order (Up) or in reverse lane order; the later factor on the left.
template <class Op, bool Up>
__device__ __forceinline__ typename Op::Elem warp_inclusive(typename Op::Elem x, int lane) {
  using T = typename Op::Real;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const auto o = Up ? shfl_up<typename Op::Elem, T>(x, off) : shfl_down<typename Op::Elem, T>(x, off);
    if (Up ? lane >= off : lane + off < 32) x = Op::compose(x, o);
  }
  return x;
}
template <class Op, bool Up>
__device__ __forceinline__ typename Op::Elem warp_exclusive(const typename Op::Elem& incl, int lane) {
  using T = typename Op::Real;
  const auto o = Up ? shfl_up<typename Op::Elem, T>(incl, 1) : shfl_down<typename Op::Elem, T>(incl, 1);
  return (Up ? lane == 0 : lane == 31) ? Op::identity() : o;
}

constexpr int kChunk = 16;                   // elements per lane
constexpr int kTile = 32 * kChunk;           // elements per warp
constexpr int kStride = kChunk + 1;          // padded shared-memory row per lane (no bank conflicts)
constexpr int kSlots = 33 * kStride;         // one array: 32 lanes and one element past the tile
constexpr int kWarps = 2;                    // tiles per block
constexpr int kLoads = kTile / 32 + 1;      // loads per lane to fill a tile and one element past it
constexpr int kFwdArrays = 8, kFwdArraysNoRatios = 4, kFwdArraysAggregate = 2, kBwdArrays = 10;
constexpr int kScanThreads = 256;

__device__ __forceinline__ int slot(int e) { return (e / kChunk) * kStride + e % kChunk; }

// The (row, direction) sequences of tile products, scanned in order: states[m] is the state
// entering position m. One block per sequence.
template <class Op>
__global__ void __launch_bounds__(kScanThreads)
    scan_kernel(const typename Op::Elem* agg, typename Op::State* states, int64_t nT) {
  __shared__ typename Op::Elem sh[kScanThreads];
  const auto* E = agg + blockIdx.x * nT;
  auto* S = states + blockIdx.x * nT;
  const int t = threadIdx.x;
  const int64_t m0 = nT * t / kScanThreads, m1 = nT * (t + 1) / kScanThreads;
  auto q = Op::identity();
  for (int64_t m = m0; m < m1; ++m) q = Op::compose(E[m], q);
  sh[t] = q;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off <<= 1) {
    auto v = sh[t];
    if (t >= off) v = Op::compose(v, sh[t - off]);
    __syncthreads();
    sh[t] = v;
    __syncthreads();
  }
  auto st = Op::init();
  if (t > 0) st = Op::apply(sh[t - 1], st);
  for (int64_t m = m0; m < m1; ++m) {
    S[m] = st;
    st = Op::apply(E[m], st);
  }
}

enum Pass : int { kAggregate = 0, kOutput = 1 };

// Forward tiles pass (Note [BK-core scan kernels]). Pass kAggregate writes the tile products;
// kOutput writes g, r, s (any of them may be null).
template <class T, int P>
__global__ void __launch_bounds__(32 * kWarps)
    forward_tiles(const T* a, const T* b, const T* c, const Cx<T>* z, Cx<T>* g, Cx<T>* r, Cx<T>* s,
                  typename Mobius<T>::Elem* agg, const typename Mobius<T>::State* states, int64_t B, int64_t N,
                  int64_t nT, bool mixed, bool causal) {
  using M = Mobius<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = int64_t(blockIdx.x) * kWarps + warp;
  if (tile >= B * nT) return;  // whole warps
  const int64_t row = tile / nT, t = tile % nT, i0 = t * kTile;
  const int n = static_cast<int>(N - i0 < kTile ? N - i0 : kTile);
  // Shared arrays per warp: A, Q, then R (which G overwrites in place unless r and s are kept),
  // then S and G when they are.
  const bool keep = r != nullptr;
  const int arrays = P == kAggregate ? kFwdArraysAggregate : keep ? kFwdArrays : kFwdArraysNoRatios;
  T* A = reinterpret_cast<T*>(smem_raw) + warp * arrays * kSlots;
  T* Q = A + kSlots;  // Q[e] = p_{i0+e-1}, zero outside 0 .. N-2
  T* Rre = Q + kSlots;
  T* Rim = Rre + kSlots;
  T* Sre = keep ? Rim + kSlots : nullptr;
  T* Sim = keep ? Sre + kSlots : nullptr;
  T* Gre = keep ? Sim + kSlots : Rre;
  T* Gim = keep ? Gre + kSlots : Rim;
  const T* __restrict__ ar = a + row * N + i0;
  const T* __restrict__ br = b + row * (N - 1);
  const T* __restrict__ cr = c + row * (N - 1);
  {  // all loads of the tile issued before the first store: enough bytes in flight per warp
    T av[kLoads], qv[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int e = lane + 32 * k;
      const int64_t i = i0 + e - 1;
      av[k] = e < n ? __ldg(ar + e) : T(0);
      qv[k] = e <= n && i >= 0 && i <= N - 2 ? __ldg(br + i) * __ldg(cr + i) : T(0);
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int e = lane + 32 * k;
      if (e <= n) {
        A[slot(e)] = av[k];
        Q[slot(e)] = qv[k];
      }
    }
  }
  __syncwarp();
  const Cx<T> zz = z[row];
  const auto d = [&](int e) { return Cx<T>{A[slot(e)] - zz.re, -zz.im}; };
  const int lo = lane * kChunk < n ? lane * kChunk : n;
  const int hi = lo + kChunk < n ? lo + kChunk : n;
  auto f = M::identity(), sv = M::identity();
  for (int e = lo; e < hi; ++e) {
    f = M::push(d(e), Q[slot(e)], f);
    if ((e - lo) % 4 == 3) f = M::rescaled(f);
  }
  f = M::rescaled(f);
  if (!causal) {
    for (int e = hi - 1; e >= lo; --e) {
      sv = M::push(d(e), Q[slot(e + 1)], sv);
      if ((hi - 1 - e) % 4 == 3) sv = M::rescaled(sv);
    }
    sv = M::rescaled(sv);
  }
  const auto fi = warp_inclusive<M, true>(f, lane);
  const auto si = warp_inclusive<M, false>(sv, lane);
  if constexpr (P == kAggregate) {
    if (lane == 31) agg[(row * 2 + 0) * nT + t] = fi;
    if (lane == 0) agg[(row * 2 + 1) * nT + (nT - 1 - t)] = si;
  } else {
    const auto sf = M::apply(warp_exclusive<M, true>(fi, lane), states[(row * 2 + 0) * nT + t]);
    const auto ss = M::apply(warp_exclusive<M, false>(si, lane), states[(row * 2 + 1) * nT + (nT - 1 - t)]);
    if (lo < hi) {
      // Entering state (x, y) = u_{lo-1}: u_lo = d - q y / x = (d x - q y) / x.
      Cx<T> u = div(sub(mul(d(lo), sf.x), scale(sf.y, Q[slot(lo)])), sf.x);
      Rre[slot(lo)] = u.re;
      Rim[slot(lo)] = u.im;
      for (int e = lo + 1; e < hi; ++e) {
        u = sub(d(e), scale(inv(u), Q[slot(e)]));
        Rre[slot(e)] = u.re;
        Rim[slot(e)] = u.im;
      }
      Cx<T> v{};
      for (int e = hi - 1; e >= lo; --e) {
        if (causal)
          v = d(e);
        else if (e == hi - 1)
          v = div(sub(mul(d(e), ss.x), scale(ss.y, Q[slot(e + 1)])), ss.x);
        else
          v = sub(d(e), scale(inv(v), Q[slot(e + 1)]));
        if (keep) {
          Sre[slot(e)] = v.re;
          Sim[slot(e)] = v.im;
        }
        const Cx<T> ru{Rre[slot(e)], Rim[slot(e)]};
        Cx<T> gi;
        if (mixed) {
          const Cx<double> q{double(ru.re) + double(v.re) - (double(A[slot(e)]) - double(zz.re)),
                             double(ru.im) + double(v.im) + double(zz.im)};
          const Cx<double> gd = inv(q);
          gi = {T(gd.re), T(gd.im)};
        } else {
          gi = inv(sub(add(ru, v), d(e)));
        }
        Gre[slot(e)] = gi.re;
        Gim[slot(e)] = gi.im;
      }
    }
    __syncwarp();
    for (int e = lane; e < n; e += 32) {
      const int64_t o = row * N + i0 + e;
      g[o] = {Gre[slot(e)], Gim[slot(e)]};
      if (keep) {
        r[o] = {Rre[slot(e)], Rim[slot(e)]};
        s[o] = {Sre[slot(e)], Sim[slot(e)]};
      }
    }
  }
}

// Backward tiles pass (Note [BK-core scan kernels]): the c sweep is the adjoint of s (ascending),
// the e sweep the adjoint of r (descending). kOutput writes ga, gb, gc and one gz partial per tile.
template <class T, int P>
__global__ void __launch_bounds__(32 * kWarps)
    backward_tiles(const Cx<T>* gg, const T* b, const T* c, const Cx<T>* g, const Cx<T>* r, const Cx<T>* s, T* ga,
                   T* gb, T* gc, Cx<T>* gz_part, typename Affine<T>::Elem* agg,
                   const typename Affine<T>::State* states, int64_t B, int64_t N, int64_t nT, bool causal) {
  using F = Affine<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = int64_t(blockIdx.x) * kWarps + warp;
  if (tile >= B * nT) return;
  const int64_t row = tile / nT, t = tile % nT, i0 = t * kTile;
  const int n = static_cast<int>(N - i0 < kTile ? N - i0 : kTile);
  T* QBre = reinterpret_cast<T*>(smem_raw) + warp * kBwdArrays * kSlots;  // qbar = -gg conj(g^2)
  T* QBim = QBre + kSlots;
  T* Rre = QBim + kSlots;
  T* Rim = Rre + kSlots;
  T* Sre = Rim + kSlots;  // s_{i0+e} for e = 0 .. n (one past the tile)
  T* Sim = Sre + kSlots;
  T* Bv = Sim + kSlots;  // b_{i0+e-1}, c_{i0+e-1}, zero outside 0 .. N-2
  T* Cv = Bv + kSlots;
  T* GA = Cv + kSlots;
  T* PB = GA + kSlots;
  const int64_t base = row * N;
  // Two rounds of loads (complex, then real), each issued in full before its stores.
  {
    Cx<T> qv[kLoads], rv[kLoads], sv[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int e = lane + 32 * k;
      const int64_t i = i0 + e;
      const Cx<T> zero{T(0), T(0)};
      const Cx<T> gi = e < n ? g[base + i] : zero;
      qv[k] = e < n ? mul(gg[base + i], conj(mul(gi, gi))) : zero;
      rv[k] = e < n ? r[base + i] : zero;
      sv[k] = e <= n && i < N ? s[base + i] : zero;
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int e = lane + 32 * k;
      if (e <= n) {
        QBre[slot(e)] = -qv[k].re;
        QBim[slot(e)] = -qv[k].im;
        Rre[slot(e)] = rv[k].re;
        Rim[slot(e)] = rv[k].im;
        Sre[slot(e)] = sv[k].re;
        Sim[slot(e)] = sv[k].im;
      }
    }
  }
  {
    T bv[kLoads], cv[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int e = lane + 32 * k;
      const int64_t j = i0 + e - 1;
      const bool in = e <= n && j >= 0 && j <= N - 2;
      bv[k] = in ? __ldg(b + row * (N - 1) + j) : T(0);
      cv[k] = in ? __ldg(c + row * (N - 1) + j) : T(0);
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int e = lane + 32 * k;
      if (e <= n) {
        Bv[slot(e)] = bv[k];
        Cv[slot(e)] = cv[k];
      }
    }
  }
  __syncwarp();
  const auto qbar = [&](int e) { return Cx<T>{QBre[slot(e)], QBim[slot(e)]}; };
  const auto sq = [](Cx<T> x) { return mul(x, x); };
  // c_i = alpha c_{i-1} + qbar_i, alpha = conj(p_{i-1} / s_i^2) (zero in the causal case).
  const auto alpha = [&](int e) {
    if (causal) return Cx<T>{T(0), T(0)};
    return conj(scale(inv(sq(Cx<T>{Sre[slot(e)], Sim[slot(e)]})), Bv[slot(e)] * Cv[slot(e)]));
  };
  // e_i = beta e_{i+1} + qbar_i, beta = conj(p_i / r_i^2).
  const auto beta = [&](int e) {
    return conj(scale(inv(sq(Cx<T>{Rre[slot(e)], Rim[slot(e)]})), Bv[slot(e + 1)] * Cv[slot(e + 1)]));
  };
  const int lo = lane * kChunk < n ? lane * kChunk : n;
  const int hi = lo + kChunk < n ? lo + kChunk : n;
  auto fc = F::identity(), fe = F::identity();
  for (int e = lo; e < hi; ++e) fc = F::push(alpha(e), qbar(e), fc);
  for (int e = hi - 1; e >= lo; --e) fe = F::push(beta(e), qbar(e), fe);
  const auto ci = warp_inclusive<F, true>(fc, lane);
  const auto ei = warp_inclusive<F, false>(fe, lane);
  if constexpr (P == kAggregate) {
    if (lane == 31) agg[(row * 2 + 0) * nT + t] = ci;
    if (lane == 0) agg[(row * 2 + 1) * nT + (nT - 1 - t)] = ei;
  } else {
    Cx<T> cv = F::apply(warp_exclusive<F, true>(ci, lane), states[(row * 2 + 0) * nT + t]).v;
    Cx<T> ev = F::apply(warp_exclusive<F, false>(ei, lane), states[(row * 2 + 1) * nT + (nT - 1 - t)]).v;
    Cx<T> zsum{T(0), T(0)};
    for (int e = lo; e < hi; ++e) {
      cv = add(mul(alpha(e), cv), qbar(e));
      const Cx<T> part = sub(cv, qbar(e));  // dbar_i = -qbar_i + c_i + e_i
      zsum = sub(zsum, part);
      GA[slot(e)] = part.re;
      const bool has_p = i0 + e <= N - 2;
      PB[slot(e)] = !causal && has_p ? -mul(cv, conj(inv(Cx<T>{Sre[slot(e + 1)], Sim[slot(e + 1)]}))).re : T(0);
    }
    for (int e = hi - 1; e >= lo; --e) {
      if (i0 + e <= N - 2) PB[slot(e)] -= mul(ev, conj(inv(Cx<T>{Rre[slot(e)], Rim[slot(e)]}))).re;
      ev = add(mul(beta(e), ev), qbar(e));
      GA[slot(e)] += ev.re;
      zsum = sub(zsum, ev);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      zsum.re += __shfl_xor_sync(0xffffffffu, zsum.re, off);
      zsum.im += __shfl_xor_sync(0xffffffffu, zsum.im, off);
    }
    if (lane == 0) gz_part[row * nT + t] = zsum;
    __syncwarp();
    for (int e = lane; e < n; e += 32) {
      const int64_t i = i0 + e;
      ga[base + i] = GA[slot(e)];
      if (i <= N - 2) {
        gb[row * (N - 1) + i] = PB[slot(e)] * Cv[slot(e + 1)];
        gc[row * (N - 1) + i] = PB[slot(e)] * Bv[slot(e + 1)];
      }
    }
  }
}

// Raises a kernel's dynamic shared-memory limit once per process (more than 48 KB needs it).
template <class Kernel>
void allow_smem(Kernel k, size_t bytes) {
  if (bytes > 48 * 1024) TANDEM_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                                static_cast<int>(bytes)));
}

}  // namespace

int64_t bk_core_tiles(int64_t N) { return (N + kTile - 1) / kTile; }

int64_t bk_core_scratch_bytes(int64_t B, int64_t N, size_t real_size, bool backward) {
  const int64_t seqs = B * 2 * bk_core_tiles(N);
  const size_t per = backward ? 6 : 12;  // elem + state, in reals
  return seqs * static_cast<int64_t>(per * real_size);
}

template <class T>
void launch_bk_core_forward(const T* a, const T* b, const T* c, const T* z, T* g, T* r, T* s, int64_t B, int64_t N,
                            bool mixed, bool causal, void* scratch, cudaStream_t stream) {
  using M = Mobius<T>;
  const int64_t nT = bk_core_tiles(N);
  auto* agg = static_cast<typename M::Elem*>(scratch);
  auto* st = reinterpret_cast<typename M::State*>(agg + B * 2 * nT);
  if ((r == nullptr) != (s == nullptr) || g == nullptr)
    ::tandem::detail::throw_internal_error(__FILE__, __LINE__, "g && (r && s || !r && !s)", "bad output pointers");
  const auto blocks = static_cast<unsigned>((B * nT + kWarps - 1) / kWarps);
  const auto smem = [](int arrays) { return size_t(kWarps) * arrays * kSlots * sizeof(T); };
  static const bool once = [&] {
    allow_smem(forward_tiles<T, kAggregate>, smem(kFwdArraysAggregate));
    allow_smem(forward_tiles<T, kOutput>, smem(kFwdArrays));
    return true;
  }();
  (void)once;
  const auto* zc = reinterpret_cast<const Cx<T>*>(z);
  forward_tiles<T, kAggregate><<<blocks, 32 * kWarps, smem(kFwdArraysAggregate), stream>>>(a, b, c, zc, nullptr, nullptr, nullptr, agg,
                                                                       nullptr, B, N, nT, mixed, causal);
  TANDEM_CUDA_LAUNCH_CHECK();
  scan_kernel<M><<<static_cast<unsigned>(B * 2), kScanThreads, 0, stream>>>(agg, st, nT);
  TANDEM_CUDA_LAUNCH_CHECK();
  forward_tiles<T, kOutput><<<blocks, 32 * kWarps, smem(r ? kFwdArrays : kFwdArraysNoRatios), stream>>>(
      a, b, c, zc, reinterpret_cast<Cx<T>*>(g), reinterpret_cast<Cx<T>*>(r), reinterpret_cast<Cx<T>*>(s), agg, st, B,
      N, nT, mixed, causal);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_bk_core_backward(const T* grad_g, const T* b, const T* c, const T* g, const T* r, const T* s, T* ga, T* gb,
                             T* gc, T* gz_part, int64_t B, int64_t N, bool causal, void* scratch,
                             cudaStream_t stream) {
  using F = Affine<T>;
  const int64_t nT = bk_core_tiles(N);
  auto* agg = static_cast<typename F::Elem*>(scratch);
  auto* st = reinterpret_cast<typename F::State*>(agg + B * 2 * nT);
  const auto blocks = static_cast<unsigned>((B * nT + kWarps - 1) / kWarps);
  const size_t smem = size_t(kWarps) * kBwdArrays * kSlots * sizeof(T);
  static const bool once = [&] {
    allow_smem(backward_tiles<T, kAggregate>, smem);
    allow_smem(backward_tiles<T, kOutput>, smem);
    return true;
  }();
  (void)once;
  const auto cx = [](const T* p) { return reinterpret_cast<const Cx<T>*>(p); };
  backward_tiles<T, kAggregate><<<blocks, 32 * kWarps, smem, stream>>>(
      cx(grad_g), b, c, cx(g), cx(r), cx(s), nullptr, nullptr, nullptr, nullptr, agg, nullptr, B, N, nT, causal);
  TANDEM_CUDA_LAUNCH_CHECK();
  scan_kernel<F><<<static_cast<unsigned>(B * 2), kScanThreads, 0, stream>>>(agg, st, nT);
  TANDEM_CUDA_LAUNCH_CHECK();
  backward_tiles<T, kOutput><<<blocks, 32 * kWarps, smem, stream>>>(cx(grad_g), b, c, cx(g), cx(r), cx(s), ga, gb, gc,
                                                                     reinterpret_cast<Cx<T>*>(gz_part), agg, st, B, N,
                                                                     nT, causal);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template void launch_bk_core_forward<float>(const float*, const float*, const float*, const float*, float*, float*,
                                            float*, int64_t, int64_t, bool, bool, void*, cudaStream_t);
template void launch_bk_core_forward<double>(const double*, const double*, const double*, const double*, double*,
                                             double*, double*, int64_t, int64_t, bool, bool, void*, cudaStream_t);
template void launch_bk_core_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                             const float*, float*, float*, float*, float*, int64_t, int64_t, bool,
                                             void*, cudaStream_t);
template void launch_bk_core_backward<double>(const double*, const double*, const double*, const double*,
                                              const double*, const double*, double*, double*, double*, double*,
                                              int64_t, int64_t, bool, void*, cudaStream_t);

}  // namespace tandem::detail
