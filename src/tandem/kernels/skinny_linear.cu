// The skinny linear's CUDA kernel (Note [Skinny linear]), launched as a dependent (Note [Dependent launch]).

#include <cuda_runtime.h>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/dependent_launch.cuh"
#include "tandem/kernels/skinny_linear_launch.h"
#include "tandem/kernels/skinny_rows.cuh"

namespace tandem::detail {
namespace {

// One warp per output feature o, for all ROWS rows of x; the bias added in fp32 before the one rounding.
template <class T, int ROWS, int IN_FLIGHT>
__global__ void __launch_bounds__(32 * kSkinnyWarps)
    skinny_linear_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                         T* __restrict__ y, int64_t K, int64_t O) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t o = int64_t{blockIdx.x} * kSkinnyWarps + static_cast<int>(threadIdx.x) / 32;
  if (o >= O) return;
  release_dependents();
  const T* rows[1] = {w + o * K};
  float sum[1][ROWS];
  warp_dots<T, ROWS, 1, IN_FLIGHT>(x, rows, K, lane, sum);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float v = sum[0][r];
    if (bias != nullptr) v += to_float(bias[o]);
    y[r * O + o] = from_float<T>(v);
  }
}

template <class T, int ROWS, int IN_FLIGHT>
void launch_in_flight(const void* x, const void* w, const void* bias, void* y, int64_t K, int64_t O,
                      cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((O + kSkinnyWarps - 1) / kSkinnyWarps);
  launch_dependent(skinny_linear_kernel<T, ROWS, IN_FLIGHT>, dim3(blocks), dim3(32 * kSkinnyWarps), 0, stream,
                   static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<T*>(y),
                   K, O);
}

}  // namespace

void launch_skinny_linear(const void* x, const void* w, const void* bias, void* y, int64_t rows, int64_t K, int64_t O,
                          ElementType elem, cudaStream_t stream) {
  if (rows == 0 || O == 0) return;
  with_element_type(elem, [&](auto tag) {
    using T = decltype(tag);
    with_skinny_rows(rows, [&](auto rows_tag) {
      constexpr int R = decltype(rows_tag)::value;
      with_in_flight<T, R>(
          K, [&](auto depth) { launch_in_flight<T, R, decltype(depth)::value>(x, w, bias, y, K, O, stream); });
    });
  });
}

}  // namespace tandem::detail
