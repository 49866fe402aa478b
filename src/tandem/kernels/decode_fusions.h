#pragma once
// The small steps of a generation layer fused into one CUDA kernel each: the norm with its cast,
// the residual add with the norm after it, RoPE with the key/value cache writes, and the gated
// activation. CUDA tensors only: elsewhere the decoder runs the LibTorch ops each replaces
// (models/norm.h, models/rope.h), which the tests hold the kernels to.
//
// Note [Decode fusions]
// At batch 1 a decode step reads each layer's weights once (tens of microseconds) and ran about
// thirty small kernels a layer besides the matrix products, each a few microseconds even when
// replayed from a CUDA graph: the norm (fp32 in, its cast to the compute dtype out), the residual
// add, RoPE (negate, concatenate, two products and a sum), two index_put writes into the cache, the
// activation and its product. Here each group is one kernel with the same arithmetic: the RoPE
// kernel rounds each product and the sum to the compute dtype as the separate ops did (no fused
// multiply-add), so its output equals the reference's bit for bit; the norm and the activation sum
// and exponentiate in another order or with another instruction, so they equal it to rounding.

#include <torch/torch.h>

#include <utility>

namespace tandem {

/// Whether the fused kernels run for tensors of this device and dtype (CUDA, fp32/fp16/bf16, in a
/// build with the CUDA kernels); the functions below refuse others.
bool decode_fusions_available(const c10::Device& device, torch::ScalarType dtype);

/// Whether the fused norms take rows of C features: a multiple of 4, at most 8192.
bool fused_norm_takes(int64_t C);

/// RMS norm of x (N, C) fp32 with scale w (C) fp32, times (1 + w) with `plus_one`, cast to `dtype`.
torch::Tensor rms_norm_cast(const torch::Tensor& x, const torch::Tensor& w, double eps, bool plus_one,
                            torch::ScalarType dtype);

/// r = x + a (x fp32, a any float dtype; r fp32) and rms_norm_cast(r, ...): returns {r, norm}.
std::pair<torch::Tensor, torch::Tensor> add_rms_norm_cast(const torch::Tensor& x, const torch::Tensor& a,
                                                          const torch::Tensor& w, double eps, bool plus_one,
                                                          torch::ScalarType dtype);

/// The queries and keys of the fused projection qkv (N, (H + 2 KV) hd) rotated by RoPE over their
/// first cos.size(-1) dimensions (cos and sin (N, 1, rotary)), and each row's key and value written
/// into the caches (P, KV, page_tokens, hd) at (page[n], slot[n]). Returns {q (N, H, hd), k (N, KV,
/// hd)}, contiguous.
std::pair<torch::Tensor, torch::Tensor> rope_write_kv(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                                      const torch::Tensor& cos, const torch::Tensor& sin,
                                                      torch::Tensor& k_cache, torch::Tensor& v_cache,
                                                      const torch::Tensor& page, const torch::Tensor& slot);

/// silu(gu[:, :F]) * gu[:, F:] of gu (N, 2F), in gu's dtype.
torch::Tensor silu_mul(const torch::Tensor& gu);

namespace detail {

/// The CUDA implementations, registered by the CUDA build (kernels/decode_fusions_cuda.cpp).
struct DecodeFusionsCudaOps {
  /// a may be undefined (no add): then x is normed and {x, norm} returned.
  std::pair<torch::Tensor, torch::Tensor> (*add_rms_norm_cast)(const torch::Tensor& x, const torch::Tensor& a,
                                                               const torch::Tensor& w, double eps, bool plus_one,
                                                               torch::ScalarType dtype);
  std::pair<torch::Tensor, torch::Tensor> (*rope_write_kv)(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                                           const torch::Tensor& cos, const torch::Tensor& sin,
                                                           torch::Tensor& k_cache, torch::Tensor& v_cache,
                                                           const torch::Tensor& page, const torch::Tensor& slot);
  torch::Tensor (*silu_mul)(const torch::Tensor& gu);
};
const DecodeFusionsCudaOps*& decode_fusions_cuda_ops();

}  // namespace detail
}  // namespace tandem
