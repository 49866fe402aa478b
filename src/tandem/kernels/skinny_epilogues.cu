// The skinny products with an epilogue (Note [Skinny epilogues]), launched as dependents (Note
// [Dependent launch]).

#include <cuda_runtime.h>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/dependent_launch.cuh"
#include "tandem/kernels/skinny_epilogues.cuh"
#include "tandem/kernels/skinny_epilogues_launch.h"
#include "tandem/kernels/skinny_rows.cuh"

namespace tandem::detail {
namespace {

// One warp per feature f: the gate's row f and the up row F + f, then silu(g) * u as silu_mul_kernel
// computes it (decode_fusions.cu).
template <class T, int ROWS, int IN_FLIGHT>
__global__ void __launch_bounds__(32 * kSkinnyWarps)
    skinny_silu_mul_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                           T* __restrict__ out, int64_t K, int64_t F) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t f = int64_t{blockIdx.x} * kSkinnyWarps + static_cast<int>(threadIdx.x) / 32;
  if (f >= F) return;
  release_dependents();
  const T* rows[2] = {w + f * K, w + (F + f) * K};
  float sum[2][ROWS];
  warp_dots<T, ROWS, 2, IN_FLIGHT>(x, rows, K, lane, sum);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float g = product(sum[0][r], bias, f), u = product(sum[1][r], bias, F + f);
    out[r * F + f] = from_float<T>(silu_times<T>(g, u));
  }
}

// One warp per unit of the projection (qkv_unit); the rotation rounds each product and the sum to T,
// as rope_write_kv_kernel does (decode_fusions.cu).
template <class T, int ROWS, int IN_FLIGHT>
__global__ void __launch_bounds__(32 * kSkinnyWarps) skinny_rope_kv_kernel(const SkinnyRopeKvArgs p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t index = int64_t{blockIdx.x} * kSkinnyWarps + static_cast<int>(threadIdx.x) / 32;
  const RopeKvArgs& r = p.rope;
  const QkvShape shape{r.H, r.KV, r.head_dim, r.rotary};
  if (index >= qkv_units(shape)) return;
  const QkvUnit unit = qkv_unit(shape, index);
  release_dependents();
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  float sum[2][ROWS];
  if (unit.partner < 0) {
    const T* rows[1] = {w + unit.row(shape) * p.K};
    float one[1][ROWS];
    warp_dots<T, ROWS, 1, IN_FLIGHT>(x, rows, p.K, lane, one);
#pragma unroll
    for (int i = 0; i < ROWS; ++i) sum[0][i] = one[0][i], sum[1][i] = 0.0f;
  } else {
    const T* rows[2] = {w + unit.row(shape) * p.K, w + unit.partner_row(shape) * p.K};
    warp_dots<T, ROWS, 2, IN_FLIGHT>(x, rows, p.K, lane, sum);
  }
  if (lane >= ROWS || lane >= r.N) return;
  const int64_t n = lane;  // lane n stores row n
  float a = 0.0f, b = 0.0f;
#pragma unroll
  for (int i = 0; i < ROWS; ++i)
    if (i == n) a = sum[0][i], b = sum[1][i];
  finish_qkv_unit<T>(r, p.v_out, shape, unit, static_cast<const T*>(p.bias),
                     static_cast<const T*>(r.cos) + n * r.rotary, static_cast<const T*>(r.sin) + n * r.rotary, n,
                     r.page[n], r.slot[n], a, b);
}

}  // namespace

void launch_skinny_silu_mul(const void* x, const void* w, const void* bias, void* out, int64_t rows, int64_t K,
                            int64_t F, ElementType elem, cudaStream_t stream) {
  if (rows == 0 || F == 0) return;
  const auto blocks = static_cast<unsigned>((F + kSkinnyWarps - 1) / kSkinnyWarps);
  with_element_type(elem, [&](auto tag) {
    using T = decltype(tag);
    with_skinny_rows(rows, [&](auto rows_tag) {
      constexpr int R = decltype(rows_tag)::value;
      const auto kernel = skinny_deep<T>(K) ? skinny_silu_mul_kernel<T, R, 8> : skinny_silu_mul_kernel<T, R, 4>;
      launch_dependent(kernel, dim3(blocks), dim3(32 * kSkinnyWarps), 0, stream, static_cast<const T*>(x),
                       static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<T*>(out), K, F);
    });
  });
}

void launch_skinny_rope_kv(const SkinnyRopeKvArgs& p, cudaStream_t stream) {
  const RopeKvArgs& r = p.rope;
  if (r.N == 0) return;
  const int64_t units = qkv_units(QkvShape{r.H, r.KV, r.head_dim, r.rotary});
  const auto blocks = static_cast<unsigned>((units + kSkinnyWarps - 1) / kSkinnyWarps);
  with_element_type(r.elem, [&](auto tag) {
    using T = decltype(tag);
    with_skinny_rows(r.N, [&](auto rows_tag) {
      constexpr int R = decltype(rows_tag)::value;
      const auto kernel = skinny_deep<T>(p.K) ? skinny_rope_kv_kernel<T, R, 8> : skinny_rope_kv_kernel<T, R, 4>;
      launch_dependent(kernel, dim3(blocks), dim3(32 * kSkinnyWarps), 0, stream, p);
    });
  });
}

}  // namespace tandem::detail
