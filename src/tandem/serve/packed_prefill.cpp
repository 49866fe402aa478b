#include "tandem/serve/packed_prefill.h"

#include <ATen/Context.h>
#include <ATen/ops/_flash_attention_forward.h>

#include <algorithm>
#include <optional>

#include "tandem/core/error.h"

namespace tandem {

// Note [Packed prefill attention]
// A serving step prefills many chunks at once: prompts that join, and, with the prefix cache,
// mostly continuations of a cached prefix (a chat template's or a system prompt's). Attending to
// them one call each cost a dozen kernels per chunk and layer (gathering its pages, a mask, the
// attention, a copy back): under 64 chat clients on an H100 a step that prefilled took about 80 ms
// against 1.9 ms for a decode step, launches rather than arithmetic. FlashAttention's
// variable-length kernel takes them all in one call per layer: the queries packed as the step lays
// its rows out (cu_q marks where each chunk's begin), each chunk's keys and values gathered from
// its pages into one packed tensor (cu_k), grouped-query heads as they are, and a causal mask
// aligned to the bottom right, so query t of a chunk that starts at `start` sees keys up to
// start + t: a continuation's mask without building it, a fresh prompt's as a special case. Its
// window (keys within `window` of the query) is window_size_left = window - 1. No shape-dependent
// plan is built, so steps of new shapes cost what repeated ones do. Steps on the CPU, in fp32, or
// with soft-capped scores keep the per-chunk path (Decoder::attention).

bool packed_prefill_supported(const c10::Device& device, torch::ScalarType dtype, int64_t head_dim, double softcap) {
  // FlashAttention needs sm80 or later, as tandem's own decode kernels (built for sm80 and sm90) do.
  return device.is_cuda() && at::globalContext().userEnabledFlashSDP() &&
         (dtype == torch::kFloat16 || dtype == torch::kBFloat16) && head_dim % 8 == 0 && head_dim <= 256 &&
         softcap <= 0;
}

PackedPrefills pack_prefills(const std::vector<PrefillChunk>& chunks, int64_t page_tokens, const c10::Device& device) {
  PackedPrefills p;
  const auto S = static_cast<int64_t>(chunks.size());
  if (S == 0) return p;
  // One host vector, one copy: cu_q (S + 1), cu_k (S + 1), then every key's page, then its slot.
  std::vector<int64_t> cu_q{0}, cu_k{0}, page, slot;
  for (const auto& c : chunks) {
    TANDEM_ASSERT(c.pages != nullptr && c.count > 0 && c.start >= 0, "a prefill chunk without tokens or pages");
    const int64_t keys = c.start + c.count;
    TANDEM_ASSERT(c.pages->capacity(page_tokens) >= keys, "page table of ", c.pages->capacity(page_tokens),
                  " tokens for a chunk ending at ", keys);
    cu_q.push_back(cu_q.back() + c.count);
    cu_k.push_back(cu_k.back() + keys);
    p.max_q = std::max(p.max_q, c.count);
    p.max_k = std::max(p.max_k, keys);
    for (int64_t t = 0; t < keys; ++t) {
      page.push_back(c.pages->pages[static_cast<size_t>(t / page_tokens)]);
      slot.push_back(t % page_tokens);
    }
  }
  const auto K = static_cast<int64_t>(page.size());
  TANDEM_CHECK(K < (int64_t{1} << 31), "a step whose prefills attend over ", K,
               " keys in all, beyond the 2^31 of the variable-length kernel; lower --max-batch or --max-step-tokens");
  std::vector<int64_t> all;
  all.reserve(2 * (S + 1) + 2 * K);
  for (const auto* v : {&cu_q, &cu_k, &page, &slot}) all.insert(all.end(), v->begin(), v->end());
  const auto d = torch::tensor(all, torch::kInt64).to(device);
  const auto cu = d.narrow(0, 0, 2 * (S + 1)).to(torch::kInt32);
  p.cu_q = cu.narrow(0, 0, S + 1);
  p.cu_k = cu.narrow(0, S + 1, S + 1);
  p.key_page = d.narrow(0, 2 * (S + 1), K);
  p.key_slot = d.narrow(0, 2 * (S + 1) + K, K);
  return p;
}

torch::Tensor packed_prefill_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                       const torch::Tensor& v_cache, const PackedPrefills& packed, int64_t window,
                                       double scale) {
  using torch::indexing::Slice;
  TANDEM_ASSERT(packed.max_q > 0 && q.dim() == 3 && k_cache.dim() == 4, "packed prefill attention of q ", q.sizes(),
                " over a cache of ", k_cache.sizes());
  // (K, KV, hd): the keys of every chunk's sequence, chunk after chunk.
  const auto k = k_cache.index({packed.key_page, Slice(), packed.key_slot});
  const auto v = v_cache.index({packed.key_page, Slice(), packed.key_slot});
  const std::optional<int64_t> left = window > 0 ? std::optional<int64_t>(window - 1) : std::nullopt;
  return std::get<0>(at::_flash_attention_forward(q, k, v, packed.cu_q, packed.cu_k, packed.max_q, packed.max_k,
                                                  /*dropout_p=*/0.0, /*is_causal=*/true,
                                                  /*return_debug_mask=*/false, scale, left, std::nullopt));
}

}  // namespace tandem
