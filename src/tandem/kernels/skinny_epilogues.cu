// The skinny products with an epilogue (Note [Skinny epilogues]), launched as dependents (Note
// [Dependent launch]).

#include <cuda_runtime.h>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/dependent_launch.cuh"
#include "tandem/kernels/skinny_epilogues_launch.h"
#include "tandem/kernels/skinny_rows.cuh"

namespace tandem::detail {
namespace {

// A weight row's sum plus its bias, rounded to T: the skinny linear's output.
template <class T>
__device__ __forceinline__ float product(float sum, const T* bias, int64_t row) {
  if (bias != nullptr) sum += to_float(bias[row]);
  return round_to<T>(sum);
}

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
    const float act = round_to<T>(g / (1.0f + expf(-g)));
    out[r * F + f] = from_float<T>(__fmul_rn(act, u));
  }
}

// Where a value of the projection goes: q_out, or k_out and the key cache, or v_out and the value cache.
template <class T>
__device__ __forceinline__ void store_qkv(const SkinnyRopeKvArgs& p, int64_t n, int64_t head, int64_t d, float value) {
  const RopeKvArgs& r = p.rope;
  const T out = from_float<T>(value);
  const int64_t H = r.H, KV = r.KV, hd = r.head_dim;
  if (head < H) {
    static_cast<T*>(r.q_out)[(n * H + head) * hd + d] = out;
    return;
  }
  const int64_t kv = head < H + KV ? head - H : head - H - KV;
  const int64_t cached = ((r.page[n] * KV + kv) * r.page_tokens + r.slot[n]) * hd + d;
  if (head < H + KV) {
    static_cast<T*>(r.k_out)[(n * KV + kv) * hd + d] = out;
    static_cast<T*>(r.k_cache)[cached] = out;
  } else {
    static_cast<T*>(p.v_out)[(n * KV + kv) * hd + d] = out;
    static_cast<T*>(r.v_cache)[cached] = out;
  }
}

// One warp per unit of the projection. A head of q or k has rotary / 2 units that each compute the
// two dimensions RoPE rotates together (d and d + rotary / 2) and hd - rotary units of one dimension
// it leaves alone; a head of v has hd / 2 units of two dimensions (d and d + hd / 2). The rotation
// rounds each product and the sum to T, as rope_write_kv_kernel does (decode_fusions.cu).
template <class T, int ROWS, int IN_FLIGHT>
__global__ void __launch_bounds__(32 * kSkinnyWarps) skinny_rope_kv_kernel(const SkinnyRopeKvArgs p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t unit = int64_t{blockIdx.x} * kSkinnyWarps + static_cast<int>(threadIdx.x) / 32;
  const RopeKvArgs& r = p.rope;
  const int64_t hd = r.head_dim, half = r.rotary / 2, qk_units = hd - half, qk_heads = r.H + r.KV;
  int64_t head = 0, d = 0, partner = -1;  // partner: the second dimension, or -1
  bool rotate = false;
  if (unit < qk_heads * qk_units) {
    head = unit / qk_units;
    const int64_t u = unit % qk_units;
    rotate = u < half;
    d = rotate ? u : r.rotary + (u - half);
    partner = rotate ? u + half : -1;
  } else {
    const int64_t u = unit - qk_heads * qk_units;
    if (u >= r.KV * (hd / 2)) return;
    head = qk_heads + u / (hd / 2);
    d = u % (hd / 2);
    partner = d + hd / 2;
  }
  release_dependents();
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  const T* bias = static_cast<const T*>(p.bias);
  const int64_t row = head * hd + d, partner_row = head * hd + partner;
  float sum[2][ROWS];
  if (partner < 0) {
    const T* rows[1] = {w + row * p.K};
    float one[1][ROWS];
    warp_dots<T, ROWS, 1, IN_FLIGHT>(x, rows, p.K, lane, one);
#pragma unroll
    for (int i = 0; i < ROWS; ++i) sum[0][i] = one[0][i];
  } else {
    const T* rows[2] = {w + row * p.K, w + partner_row * p.K};
    warp_dots<T, ROWS, 2, IN_FLIGHT>(x, rows, p.K, lane, sum);
  }
  if (lane >= ROWS || lane >= r.N) return;
  const int64_t n = lane;  // lane n stores row n
  float a = 0.0f, b = 0.0f;
#pragma unroll
  for (int i = 0; i < ROWS; ++i)
    if (i == n) {
      a = product(sum[0][i], bias, row);
      if (partner >= 0) b = product(sum[1][i], bias, partner_row);
    }
  if (rotate) {
    const T* cos = static_cast<const T*>(r.cos) + n * r.rotary;
    const T* sin = static_cast<const T*>(r.sin) + n * r.rotary;
    const float ra = __fadd_rn(round_to<T>(__fmul_rn(a, to_float(cos[d]))),
                               round_to<T>(__fmul_rn(-b, to_float(sin[d]))));
    const float rb = __fadd_rn(round_to<T>(__fmul_rn(b, to_float(cos[partner]))),
                               round_to<T>(__fmul_rn(a, to_float(sin[partner]))));
    a = ra, b = rb;
  }
  store_qkv<T>(p, n, head, d, a);
  if (partner >= 0) store_qkv<T>(p, n, head, partner, b);
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
  const int64_t units = (r.H + r.KV) * (r.head_dim - r.rotary / 2) + r.KV * (r.head_dim / 2);
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
