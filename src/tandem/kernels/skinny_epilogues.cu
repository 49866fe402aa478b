// The skinny products with an epilogue (Note [Skinny epilogues]), launched as dependents (Note
// [Dependent launch]).

#include <cuda_runtime.h>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/dependent_launch.cuh"
#include "tandem/kernels/skinny_epilogues.cuh"
#include "tandem/kernels/skinny_epilogues_launch.h"
#include "tandem/kernels/skinny_norm_in.cuh"
#include "tandem/kernels/skinny_rows.cuh"

namespace tandem::detail {
namespace {

// One warp per feature f: the gate's row f and the up row F + f, then silu(g) * u as silu_mul_kernel
// computes it (decode_fusions.cu). NORMED: x is the norm that `norm` describes (Note [Norm in the
// product]), and a warp past F computes the last feature again, for the block's norm, storing nothing.
template <class T, int ROWS, int IN_FLIGHT, bool NORMED>
__global__ void __launch_bounds__(32 * kSkinnyWarps)
    skinny_silu_mul_kernel(const NormArgs norm, const T* __restrict__ x, const T* __restrict__ w,
                           const T* __restrict__ bias, T* __restrict__ out, int64_t K, int64_t F) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t f = int64_t{blockIdx.x} * kSkinnyWarps + static_cast<int>(threadIdx.x) / 32;
  if (!NORMED && f >= F) return;
  release_dependents();
  const int64_t row = f < F ? f : F - 1;
  const T* rows[2] = {w + row * K, w + (F + row) * K};
  float sum[2][ROWS];
  product_dots<T, ROWS, 2, IN_FLIGHT, NORMED>(norm, x, rows, K, lane, sum);
  if (lane != 0 || f >= F) return;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float g = product(sum[0][r], bias, f), u = product(sum[1][r], bias, F + f);
    out[r * F + f] = from_float<T>(silu_times<T>(g, u));
  }
}

// Lane n (below the step's rows) of a warp finishes row n of its unit (finish_qkv_unit).
template <class T, int ROWS>
__device__ __forceinline__ void finish_rows(const SkinnyRopeKvArgs& p, const QkvShape& shape, const QkvUnit& unit,
                                            int lane, const float (&sum)[2][ROWS]) {
  const RopeKvArgs& r = p.rope;
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
  finish_rows<T, ROWS>(p, shape, unit, lane, sum);
}

// skinny_rope_kv_kernel with x the norm that p.norm describes (Note [Norm in the product]). Every
// warp dots two rows, so that the block's norm is reached from one place: a unit without a partner
// reads its own row twice (L2 serves the second), a warp past the units the last unit, storing nothing.
template <class T, int ROWS, int IN_FLIGHT>
__global__ void __launch_bounds__(32 * kSkinnyWarps) skinny_rope_kv_normed_kernel(const SkinnyRopeKvArgs p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t index = int64_t{blockIdx.x} * kSkinnyWarps + static_cast<int>(threadIdx.x) / 32;
  const RopeKvArgs& r = p.rope;
  const QkvShape shape{r.H, r.KV, r.head_dim, r.rotary};
  const int64_t units = qkv_units(shape);
  const QkvUnit unit = qkv_unit(shape, index < units ? index : units - 1);
  release_dependents();
  const T* w = static_cast<const T*>(p.w);
  const int64_t second = unit.partner < 0 ? unit.row(shape) : unit.partner_row(shape);
  const T* rows[2] = {w + unit.row(shape) * p.K, w + second * p.K};
  float sum[2][ROWS];
  product_dots<T, ROWS, 2, IN_FLIGHT, true>(p.norm, nullptr, rows, p.K, lane, sum);
  if (index >= units) return;
  if (unit.partner < 0)
#pragma unroll
    for (int i = 0; i < ROWS; ++i) sum[1][i] = 0.0f;
  finish_rows<T, ROWS>(p, shape, unit, lane, sum);
}

// Shared memory of a normed product: its ROWS rows of x.
template <class T, int ROWS>
size_t normed_bytes(int64_t K) {
  return static_cast<size_t>(ROWS) * static_cast<size_t>(K) * sizeof(T);
}

}  // namespace

void launch_skinny_silu_mul(const NormArgs* norm, const void* x, const void* w, const void* bias, void* out,
                            int64_t rows, int64_t K, int64_t F, ElementType elem, cudaStream_t stream) {
  if (rows == 0 || F == 0) return;
  const auto blocks = static_cast<unsigned>((F + kSkinnyWarps - 1) / kSkinnyWarps);
  const NormArgs none;
  with_element_type(elem, [&](auto tag) {
    using T = decltype(tag);
    with_skinny_rows(rows, [&](auto rows_tag) {
      constexpr int R = decltype(rows_tag)::value;
      with_in_flight<T, R>(K, [&](auto depth) {
        constexpr int D = decltype(depth)::value;
        const auto kernel =
            norm != nullptr ? skinny_silu_mul_kernel<T, R, D, true> : skinny_silu_mul_kernel<T, R, D, false>;
        launch_dependent(kernel, dim3(blocks), dim3(32 * kSkinnyWarps), norm != nullptr ? normed_bytes<T, R>(K) : 0,
                         stream, norm != nullptr ? *norm : none, static_cast<const T*>(x), static_cast<const T*>(w),
                         static_cast<const T*>(bias), static_cast<T*>(out), K, F);
      });
    });
  });
}

void launch_skinny_rope_kv(const SkinnyRopeKvArgs& p, cudaStream_t stream) {
  const RopeKvArgs& r = p.rope;
  if (r.N == 0) return;
  const int64_t units = qkv_units(QkvShape{r.H, r.KV, r.head_dim, r.rotary});
  const auto blocks = static_cast<unsigned>((units + kSkinnyWarps - 1) / kSkinnyWarps);
  const bool normed = p.norm.x != nullptr;
  with_element_type(r.elem, [&](auto tag) {
    using T = decltype(tag);
    with_skinny_rows(r.N, [&](auto rows_tag) {
      constexpr int R = decltype(rows_tag)::value;
      with_in_flight<T, R>(p.K, [&](auto depth) {
        constexpr int D = decltype(depth)::value;
        if (normed)
          return launch_dependent(skinny_rope_kv_normed_kernel<T, R, D>, dim3(blocks), dim3(32 * kSkinnyWarps),
                                  normed_bytes<T, R>(p.K), stream, p);
        launch_dependent(skinny_rope_kv_kernel<T, R, D>, dim3(blocks), dim3(32 * kSkinnyWarps), 0, stream, p);
      });
    });
  });
}

}  // namespace tandem::detail
