#pragma once
// Scaled dot-product attention as the decoder families compute it: causal, within a sliding window
// of keys, grouped (fewer key/value heads than query heads), with a scale of its own and soft-capped
// scores (Gemma2).

#include <torch/torch.h>

namespace tandem {

struct AttentionOptions {
  double scale = 0;    ///< the scores' scale; 0: 1 / sqrt(head_dim)
  double softcap = 0;  ///< scores become softcap * tanh(scores / softcap); 0: none
};

/// q (B, H, Tq, hd) attending over k and v (B, KV, Tk, hd), KV dividing H (query head h reads
/// key/value head h / (H / KV)). `mask` (broadcast to (B, H, Tq, Tk), true = attend) or, when
/// undefined, causal attention over the same positions (Tq = Tk). Through
/// scaled_dot_product_attention, or, with a softcap (which it cannot apply), through the scores
/// in q's dtype and a softmax in fp32, as transformers' eager attention does. Returns (B, H, Tq, hd).
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                     const AttentionOptions& options);

/// (T, T) bool: query t attends to key s when s <= t and, with a window, t - s < window.
torch::Tensor causal_mask(int64_t T, int64_t window, const c10::Device& device);

/// Key positions `keys` (any shape) within the window of query positions `queries` (broadcast):
/// keys > queries - window (window > 0).
torch::Tensor within_window(const torch::Tensor& keys, const torch::Tensor& queries, int64_t window);

}  // namespace tandem
