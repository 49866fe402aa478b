#pragma once
// The warp-level core of the skinny products (Note [Skinny linear]): one warp dots one or two weight
// rows with each of the few rows of x. The plain product (skinny_linear.cu) and the products with an
// epilogue (skinny_epilogues.cu) are built on it, so a feature's sum has the same bits in each.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/dependent_launch.cuh"

namespace tandem::detail {

/// Warps in a block of every skinny kernel.
constexpr int kSkinnyWarps = 8;

/// acc + the dot product of two 16-byte pieces of T.
template <class T>
__device__ __forceinline__ float dot16(const uint4& xr, const uint4& wr, float acc) {
  constexpr int per = 16 / static_cast<int>(sizeof(T));
  const T* xe = reinterpret_cast<const T*>(&xr);
  const T* we = reinterpret_cast<const T*>(&wr);
#pragma unroll
  for (int i = 0; i < per; ++i) acc = fmaf(to_float(xe[i]), to_float(we[i]), acc);
  return acc;
}

// IN_FLIGHT 16-byte pieces of each of the WROWS weight rows from piece `base` on (zeros past the end).
template <class T, int WROWS, int IN_FLIGHT>
__device__ __forceinline__ void load_pieces(const T* const (&w)[WROWS], int64_t pieces, int64_t base,
                                            uint4 (&wv)[WROWS][IN_FLIGHT]) {
#pragma unroll
  for (int j = 0; j < WROWS; ++j)
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const int64_t c = base + 32 * u;
      wv[j][u] = c < pieces ? __ldcs(reinterpret_cast<const uint4*>(w[j]) + c)  // streamed: read once
                            : make_uint4(0, 0, 0, 0);
    }
}

/// sum[j][r] = x[r] . w[j] for the WROWS weight rows w[j] (K elements each) and the ROWS rows of x
/// (contiguous, K apart), on every lane. Each lane loads IN_FLIGHT 16-byte pieces of every weight row
/// before using any, and walks its pieces in increasing order whatever IN_FLIGHT and WROWS are, so
/// the sums do not depend on either. Once its first weights are asked for it calls `ready()`, then
/// reads x: warp_dots waits there for the kernels ahead on the stream (Note [Dependent launch]) and
/// reads x from global memory; a product whose block computes its own x (Note [Norm in the
/// product]) waits, writes x into shared memory and syncs the block there (X_SHARED). The weights
/// are not the kernels ahead's to write, so a product launched early streams them while the kernel
/// before it ends. The caller touches nothing the kernels ahead write before calling it.
template <class T, int ROWS, int WROWS, int IN_FLIGHT, bool X_SHARED, class Ready>
__device__ __forceinline__ void warp_dots_after(const T* x, const T* const (&w)[WROWS], int64_t K, int lane,
                                                float (&sum)[WROWS][ROWS], Ready ready) {
  constexpr int per = 16 / static_cast<int>(sizeof(T));
  const int64_t pieces = K / per;
  const uint4* xr = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int j = 0; j < WROWS; ++j)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sum[j][r] = 0.0f;
  uint4 wv[WROWS][IN_FLIGHT];
  load_pieces<T, WROWS, IN_FLIGHT>(w, pieces, lane, wv);
  ready();
  for (int64_t base = lane; base < pieces; base += 32 * IN_FLIGHT) {
    if (base != lane) load_pieces<T, WROWS, IN_FLIGHT>(w, pieces, base, wv);
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const int64_t c = base + 32 * u;
      if (c >= pieces) break;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        uint4 xv;
        if constexpr (X_SHARED) {
          xv = xr[r * pieces + c];
        } else {
          xv = __ldg(xr + r * pieces + c);
        }
#pragma unroll
        for (int j = 0; j < WROWS; ++j) sum[j][r] = dot16<T>(xv, wv[j][u], sum[j][r]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < WROWS; ++j)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sum[j][r] = warp_sum(sum[j][r]);
}

/// warp_dots_after with x in global memory, written by the kernels ahead: it waits for them.
template <class T, int ROWS, int WROWS, int IN_FLIGHT>
__device__ __forceinline__ void warp_dots(const T* __restrict__ x, const T* const (&w)[WROWS], int64_t K, int lane,
                                          float (&sum)[WROWS][ROWS]) {
  warp_dots_after<T, ROWS, WROWS, IN_FLIGHT, false>(x, w, K, lane, sum, [] { wait_for_prior_grids(); });
}

/// warp_dots' sums with x (ROWS rows, K apart) and the WROWS weight rows in shared memory, where the
/// persistent decode step has them (Note [Persistent decode step]): each lane walks the same pieces
/// in the same order, so the sums have warp_dots' bits.
template <class T, int ROWS, int WROWS>
__device__ __forceinline__ void shared_dots(const T* x, const T* const (&w)[WROWS], int64_t K, int lane,
                                            float (&sum)[WROWS][ROWS]) {
  constexpr int per = 16 / static_cast<int>(sizeof(T));
  const int pieces = static_cast<int>(K / per);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int j = 0; j < WROWS; ++j)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sum[j][r] = 0.0f;
#pragma unroll 4
  for (int c = lane; c < pieces; c += 32) {
    uint4 wv[WROWS];
#pragma unroll
    for (int j = 0; j < WROWS; ++j) wv[j] = reinterpret_cast<const uint4*>(w[j])[c];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const uint4 xv = xr[r * pieces + c];
#pragma unroll
      for (int j = 0; j < WROWS; ++j) sum[j][r] = dot16<T>(xv, wv[j], sum[j][r]);
    }
  }
#pragma unroll
  for (int j = 0; j < WROWS; ++j)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sum[j][r] = warp_sum(sum[j][r]);
}

/// Calls f(std::integral_constant<int, n>{}) with n the pieces a lane keeps in flight for weight rows
/// of K elements of T in a product of ROWS rows of x. One row: 8, so that a row of up to 4 KB is
/// wholly asked for before the wait (Note [Dependent launch]), and 16 on rows of 16 KB and more. 2
/// to 4 rows: 8 on rows of 8 KB and more, else 4. Measured on an H100 (2026-12-07, Llama-3.2-1B's
/// shape, docs/benchmarks.md): one row's 8 and 16 against 4 and 8 took its batch-1 decode step from
/// 1.25-1.27 to 1.22-1.23 ms in one call; `tandem bench skinny_linear` there: o 4.62 -> 3.98 us, q/k/v
/// 5.74 -> 5.37, and the down product's 16 KB rows the same with 16 as with 8 (15.83 against 15.69
/// us). Earlier (2026-11-27): with 8, Llama-2-7B's o and down products ran 24 % and 16 % faster and
/// its q/k/v and gate/up within 4 %.
template <class T, int ROWS, class F>
void with_in_flight(int64_t K, F&& f) {
  const int64_t bytes = K * static_cast<int64_t>(sizeof(T));
  if constexpr (ROWS == 1) {
    if (bytes >= 16384) return f(std::integral_constant<int, 16>{});
  } else {
    if (bytes < 8192) return f(std::integral_constant<int, 4>{});
  }
  f(std::integral_constant<int, 8>{});
}

/// Calls f(std::integral_constant<int, rows>{}) for rows 1 to 4 (kSkinnyRows).
template <class F>
void with_skinny_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

}  // namespace tandem::detail
