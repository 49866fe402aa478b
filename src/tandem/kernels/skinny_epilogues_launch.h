#pragma once
// Launchers of the skinny products with an epilogue (kernels/skinny_epilogues.cu): raw device
// pointers and an explicit stream, no LibTorch. See Note [Skinny epilogues].

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tandem/kernels/element_type.h"

namespace tandem::detail {

/// out (rows, F) = silu(g) * u of g = x w[:F]^T + bias[:F] and u = x w[F:]^T + bias[F:] (w (2F, K),
/// bias (2F) or null), g and u rounded to the element type as the skinny linear stores them and the
/// activation computed as launch_silu_mul computes it; the skinny linear's alignment and row limits.
void launch_skinny_silu_mul(const void* x, const void* w, const void* bias, void* out, int64_t rows, int64_t K,
                            int64_t F, ElementType elem, cudaStream_t stream);

/// qkv = x w^T + bias (w ((H + 2 KV) hd, K), bias or null), rounded to the element type, then what
/// launch_rope_write_kv does with it: RoPE on the first `rotary` dimensions of each head of q and k,
/// q into q_out (rows, H, hd), k into k_out (rows, KV, hd) and v into v_out (rows, KV, hd), k and v
/// into the caches (P, KV, page_tokens, hd) at (page[n], slot[n]). cos and sin (rows, rotary).
struct SkinnyRopeKvArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  void* q_out = nullptr;
  void* k_out = nullptr;
  void* v_out = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* page = nullptr;
  const int64_t* slot = nullptr;
  int64_t rows = 0, K = 0, H = 0, KV = 0, head_dim = 0, rotary = 0, page_tokens = 0;
  ElementType elem = ElementType::kF32;
};
void launch_skinny_rope_kv(const SkinnyRopeKvArgs& args, cudaStream_t stream);

}  // namespace tandem::detail
