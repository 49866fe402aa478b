#pragma once
// Launchers of the skinny products with an epilogue (kernels/skinny_epilogues.cu): raw device
// pointers and an explicit stream, no LibTorch. See Note [Skinny epilogues].

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tandem/kernels/decode_fusions_launch.h"
#include "tandem/kernels/element_type.h"

namespace tandem::detail {

/// out (rows, F) = silu(g) * u of g = x w[:F]^T + bias[:F] and u = x w[F:]^T + bias[F:] (w (2F, K),
/// bias (2F) or null), g and u rounded to the element type as the skinny linear stores them and the
/// activation computed as launch_silu_mul computes it; the skinny linear's alignment and row limits.
/// With `norm` (else null), x is what launch_add_rms_norm would write to norm->out (norm->a of the
/// element type or null, norm->C == K, norm->rows == rows), formed by each block itself, and
/// norm->r is written (Note [Norm in the product]); x is then unused.
void launch_skinny_silu_mul(const NormArgs* norm, const void* x, const void* w, const void* bias, void* out,
                            int64_t rows, int64_t K, int64_t F, ElementType elem, cudaStream_t stream);

/// qkv = x w^T + bias (w ((H + 2 KV) hd, K), bias or null), rounded to the element type, then what
/// launch_rope_write_kv does with `rope` (its qkv unused) on it, and v also into v_out (N, KV, hd).
/// With norm.x given, x is the norm it describes, as for launch_skinny_silu_mul.
struct SkinnyRopeKvArgs {
  RopeKvArgs rope;
  NormArgs norm;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  void* v_out = nullptr;
  int64_t K = 0;
};
void launch_skinny_rope_kv(const SkinnyRopeKvArgs& args, cudaStream_t stream);

}  // namespace tandem::detail
