// The skinny linear's CUDA kernel (Note [Skinny linear]), launched as a dependent (Note [Dependent launch]).

#include <cuda_runtime.h>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/dependent_launch.cuh"
#include "tandem/kernels/skinny_linear_launch.h"

namespace tandem::detail {
namespace {

constexpr int kWarps = 8;

// Dot products of 16-byte pieces: acc += sum_i x[i] * w[i].
template <class T>
__device__ __forceinline__ float dot16(const uint4& xr, const uint4& wr, float acc) {
  constexpr int per = 16 / static_cast<int>(sizeof(T));
  const T* xe = reinterpret_cast<const T*>(&xr);
  const T* we = reinterpret_cast<const T*>(&wr);
#pragma unroll
  for (int i = 0; i < per; ++i) acc = fmaf(to_float(xe[i]), to_float(we[i]), acc);
  return acc;
}

// Output feature o's ROWS dot products by one warp, IN_FLIGHT 16-byte pieces of the weight row a lane
// loads before using any.
template <class T, int ROWS, int IN_FLIGHT>
__device__ __forceinline__ void warp_row(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                         T* __restrict__ y, int64_t K, int64_t O, int64_t o, int lane) {
  constexpr int per = 16 / static_cast<int>(sizeof(T));
  const int64_t pieces = K / per;
  const uint4* wr = reinterpret_cast<const uint4*>(w + o * K);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
  for (int64_t base = lane; base < pieces; base += 32 * IN_FLIGHT) {
    uint4 wv[IN_FLIGHT];
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const int64_t c = base + 32 * u;
      wv[u] = c < pieces ? __ldcs(wr + c) : make_uint4(0, 0, 0, 0);  // streamed: read once
    }
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const int64_t c = base + 32 * u;
      if (c >= pieces) break;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r] = dot16<T>(__ldg(xr + r * pieces + c), wv[u], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float v = warp_sum(acc[r]);
    if (lane == 0) {
      if (bias != nullptr) v += to_float(bias[o]);
      y[r * O + o] = from_float<T>(v);
    }
  }
}

// One warp per output feature o, for all ROWS rows of x.
template <class T, int ROWS, int IN_FLIGHT>
__global__ void __launch_bounds__(32 * kWarps)
    skinny_linear_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                         T* __restrict__ y, int64_t K, int64_t O) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t o = int64_t{blockIdx.x} * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (o >= O) return;
  release_dependents();
  wait_for_prior_grids();
  warp_row<T, ROWS, IN_FLIGHT>(x, w, bias, y, K, O, o, lane);
}

template <class T, int ROWS, int IN_FLIGHT>
void launch_in_flight(const void* x, const void* w, const void* bias, void* y, int64_t K, int64_t O,
                      cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((O + kWarps - 1) / kWarps);
  launch_dependent(skinny_linear_kernel<T, ROWS, IN_FLIGHT>, dim3(blocks), dim3(32 * kWarps), 0, stream,
                   static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<T*>(y),
                   K, O);
}

// Rows of 8 KB and more keep 8 pieces a lane in flight, shorter ones 4 (`tandem bench
// skinny_linear` on an H100, with an L2 prefetch since removed: with 8, Llama-2-7B's o and down
// products ran 24 % and 16 % faster and its q/k/v and gate/up within 4 %; with 4, the 1B folder's
// q/k/v product ran 15 % faster).
template <class T, int ROWS>
void launch_rows(const void* x, const void* w, const void* bias, void* y, int64_t K, int64_t O, cudaStream_t stream) {
  if (K * static_cast<int64_t>(sizeof(T)) >= 8192) return launch_in_flight<T, ROWS, 8>(x, w, bias, y, K, O, stream);
  launch_in_flight<T, ROWS, 4>(x, w, bias, y, K, O, stream);
}

}  // namespace

void launch_skinny_linear(const void* x, const void* w, const void* bias, void* y, int64_t rows, int64_t K, int64_t O,
                          ElementType elem, cudaStream_t stream) {
  if (rows == 0 || O == 0) return;
  with_element_type(elem, [&](auto tag) {
    using T = decltype(tag);
    switch (rows) {
      case 1:
        return launch_rows<T, 1>(x, w, bias, y, K, O, stream);
      case 2:
        return launch_rows<T, 2>(x, w, bias, y, K, O, stream);
      case 3:
        return launch_rows<T, 3>(x, w, bias, y, K, O, stream);
      default:
        return launch_rows<T, 4>(x, w, bias, y, K, O, stream);
    }
  });
}

}  // namespace tandem::detail
