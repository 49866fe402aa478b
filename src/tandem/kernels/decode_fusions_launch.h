#pragma once
// Launchers of the decode fusions' CUDA kernels (kernels/decode_fusions.cu): raw device pointers
// and an explicit stream, no LibTorch. See Note [Decode fusions].

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tandem/kernels/element_type.h"

namespace tandem::detail {

/// r = x + a (a null: r = x, not written), out = cast(r / rms(r) * (w or 1 + w)); x, r, w fp32,
/// a of a_elem, out of out_elem; rows of C elements, contiguous.
struct NormArgs {
  const float* x = nullptr;
  const void* a = nullptr;
  ElementType a_elem = ElementType::kF32;
  float* r = nullptr;
  const float* w = nullptr;
  void* out = nullptr;
  ElementType out_elem = ElementType::kF32;
  int64_t rows = 0, C = 0;
  float eps = 0.0f;
  bool plus_one = false;
};
void launch_add_rms_norm(const NormArgs& args, cudaStream_t stream);

/// RoPE on the first `rotary` dimensions of q and k of qkv (N, (H + 2 KV) hd), each product and the
/// sum rounded to the element type; q into q_out (N, H, hd), k into k_out (N, KV, hd) and the cache,
/// v into the cache, at (page[n], slot[n]) of caches (P, KV, page_tokens, hd). cos and sin (N, rotary).
struct RopeKvArgs {
  const void* qkv = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  void* q_out = nullptr;
  void* k_out = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* page = nullptr;
  const int64_t* slot = nullptr;
  int64_t N = 0, H = 0, KV = 0, head_dim = 0, rotary = 0, page_tokens = 0;
  ElementType elem = ElementType::kF32;
};
void launch_rope_write_kv(const RopeKvArgs& args, cudaStream_t stream);

/// out (N, F) = silu(gu[:, :F]) * gu[:, F:], each rounded to the element type.
void launch_silu_mul(const void* gu, void* out, int64_t N, int64_t F, ElementType elem, cudaStream_t stream);

}  // namespace tandem::detail
