#pragma once
// Every prefill of a generation step attended in one call (Note [Packed prefill attention]):
// FlashAttention's variable-length kernel over the step's packed query rows and their sequences'
// keys and values gathered from the paged cache.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "tandem/serve/kv_cache.h"
#include "tandem/serve/step_layout.h"

namespace tandem {

/// Whether the variable-length kernel takes a decoder's prefills: a CUDA device, fp16 or bf16,
/// head_dim a multiple of 8 up to 256, and no soft-capped scores (it cannot apply the cap).
bool packed_prefill_supported(const c10::Device& device, torch::ScalarType dtype, int64_t head_dim, double softcap);

/// A prefill chunk: `count` new tokens of the sequence whose pages are `pages`, after `start`
/// tokens already in the cache.
struct PrefillChunk {
  const PageTable* pages = nullptr;
  int64_t start = 0, count = 0;
};

/// The packing of a step's prefill chunks, in step order (one copy to `device`).
PackedPrefills pack_prefills(const std::vector<PrefillChunk>& chunks, int64_t page_tokens, const c10::Device& device);

/// q (Q, H, hd): the prefills' query rows in step order, attending causally (and within `window`
/// keys when > 0) over their sequences' keys and values in the caches (P, KV, page_tokens, hd),
/// which already hold the step's own. Returns (Q, H, hd).
torch::Tensor packed_prefill_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                       const torch::Tensor& v_cache, const PackedPrefills& packed, int64_t window,
                                       double scale);

}  // namespace tandem
