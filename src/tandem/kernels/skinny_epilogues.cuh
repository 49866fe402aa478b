#pragma once
// The device side of the products' epilogues (Note [Skinny epilogues]) that the persistent decode
// step repeats bit for bit (Note [Persistent decode step]): what a unit of the q/k/v projection
// (kernels/qkv_units.h) becomes (RoPE and the stores into q and the caches), and the rounding of a
// product with its bias.

#include <cuda_runtime.h>

#include <cstdint>

#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/decode_fusions.cuh"
#include "tandem/kernels/decode_fusions_launch.h"
#include "tandem/kernels/qkv_units.h"

namespace tandem::detail {

/// A weight row's sum plus its bias (null: none), rounded to T: the skinny linear's output.
template <class T>
__device__ __forceinline__ float product(float sum, const T* bias, int64_t row) {
  if (bias != nullptr) sum += to_float(bias[row]);
  return round_to<T>(sum);
}

/// Where a value of row n of the projection goes: q_out, or k_out (when given) and the key cache,
/// or v_out (when given) and the value cache (P, KV, page_tokens, hd), at (page, slot).
template <class T>
__device__ __forceinline__ void store_qkv(const RopeKvArgs& r, void* v_out, int64_t n, int64_t page, int64_t slot,
                                          int64_t head, int64_t d, float value) {
  const T out = from_float<T>(value);
  const int64_t H = r.H, KV = r.KV, hd = r.head_dim;
  if (head < H) {
    static_cast<T*>(r.q_out)[(n * H + head) * hd + d] = out;
    return;
  }
  const int64_t kv = head < H + KV ? head - H : head - H - KV;
  const int64_t cached = ((page * KV + kv) * r.page_tokens + slot) * hd + d;
  if (head < H + KV) {
    if (r.k_out != nullptr) static_cast<T*>(r.k_out)[(n * KV + kv) * hd + d] = out;
    static_cast<T*>(r.k_cache)[cached] = out;
  } else {
    if (v_out != nullptr) static_cast<T*>(v_out)[(n * KV + kv) * hd + d] = out;
    static_cast<T*>(r.v_cache)[cached] = out;
  }
}

/// Row n of unit u from its sums a (d's) and b (the partner's; unused without one), the bias added
/// and rounded as the skinny linear stores them, rotated by RoPE with the row's cos and sin
/// (rotary elements each) when the unit rotates, then stored (store_qkv).
template <class T>
__device__ __forceinline__ void finish_qkv_unit(const RopeKvArgs& r, void* v_out, const QkvShape& s, const QkvUnit& u,
                                                const T* bias, const T* cos, const T* sin, int64_t n, int64_t page,
                                                int64_t slot, float a, float b) {
  a = product(a, bias, u.row(s));
  if (u.partner >= 0) b = product(b, bias, u.partner_row(s));
  if (u.rotate) {
    const float ra = rotated<T>(a, -b, to_float(cos[u.d]), to_float(sin[u.d]));
    const float rb = rotated<T>(b, a, to_float(cos[u.partner]), to_float(sin[u.partner]));
    a = ra, b = rb;
  }
  store_qkv<T>(r, v_out, n, page, slot, u.head, u.d, a);
  if (u.partner >= 0) store_qkv<T>(r, v_out, n, page, slot, u.head, u.partner, b);
}

}  // namespace tandem::detail
