#pragma once
// Decode attention over a paged KV cache: one new query per sequence attending over its cached
// keys and values where they lie, page by page, with no gathered copy.
//
// Note [Paged decode attention]
// Generation's decode step gathered each sequence's pages into a padded contiguous (B, KV, S, hd)
// copy of its keys and another of its values, then ran scaled_dot_product_attention with a length
// mask: per layer that writes and reads again all the running sequences' keys and values (under load,
// at batch 256 and 600 tokens each, more bytes than the layer's weights) and costs six or more
// kernels. The CUDA kernel here reads the pages in place through the page table: one block per
// (sequence, key/value head, split of the keys), the block's query heads (those sharing the
// key/value head, grouped-query attention) in shared memory; each warp takes 32 keys at a time, a
// lane a key, for the scores, then the 32 values row by row (a lane owns hd/32 dimensions); the
// softmax is online (a running maximum and sum, as FlashAttention's), in fp32 with exp2. A long
// sequence's keys are split over several blocks when the batch alone would not fill the GPU (as
// flash-decoding does), their partial sums combined by a second kernel. The keys a query sees are
// [max(0, length - window), length): the length mask and the sliding window of the gather path.
// Soft-capped scores (Gemma2) keep the gather path. The scalar reference below, in fp32 on any
// device, is what the kernel is tested against.

#include <torch/torch.h>

#include <cstdint>

namespace tandem {

/// q (B, H, hd), the last dimension contiguous; k_cache and v_cache (P, KV, page_tokens, hd)
/// contiguous, KV dividing H; pages (B, W) int64, page w of row b holding its tokens
/// [w * page_tokens, (w + 1) * page_tokens); lengths (B) int64, each in [1, W * page_tokens].
/// Query head h attends over key/value head h / (H / KV), keys [max(0, length - window), length)
/// (window <= 0: from 0), scores times `scale`. Returns (B, H, hd) in q's dtype: the CUDA kernel
/// for CUDA tensors it supports (paged_decode_attention_supported), else the reference.
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                     const torch::Tensor& pages, const torch::Tensor& lengths, int64_t window,
                                     double scale);

/// Whether the CUDA kernel takes queries of this dtype and device, `heads` query heads over
/// `kv_heads` of `head_dim`: CUDA tensors of fp32, fp16 or bf16, head_dim 64, 128 or 256, at most 8
/// query heads a key/value head, in a build with the CUDA kernels.
bool paged_decode_attention_supported(const c10::Device& device, torch::ScalarType dtype, int64_t heads,
                                      int64_t kv_heads, int64_t head_dim);

namespace detail {

/// The reference: each row's keys and values looked up page by page, scores and softmax in fp32,
/// on the tensors' device. Returns (B, H, hd) in q's dtype.
torch::Tensor paged_decode_attention_reference(const torch::Tensor& q, const torch::Tensor& k_cache,
                                               const torch::Tensor& v_cache, const torch::Tensor& pages,
                                               const torch::Tensor& lengths, int64_t window, double scale);

/// The CUDA implementation, registered by the CUDA build (kernels/paged_attention_cuda.cpp).
struct PagedAttentionCudaOps {
  bool (*supported)(torch::ScalarType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim);
  torch::Tensor (*decode)(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                          const torch::Tensor& pages, const torch::Tensor& lengths, int64_t window, double scale);
};
const PagedAttentionCudaOps*& paged_attention_cuda_ops();

}  // namespace detail
}  // namespace tandem
