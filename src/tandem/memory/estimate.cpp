#include "tandem/memory/estimate.h"

namespace tandem {

std::vector<std::pair<std::string, int64_t>> MemoryEstimate::rows() const {
  return {{"weights (fp32)", weights},
          {"gradients (fp32)", grads},
          {"AdamW states (fp32 m, v)", optimizer},
          {"activations", activations},
          {"logits and loss", logits}};
}

MemoryEstimate estimate_training_memory(const ModelSpec& s, int64_t B, int64_t T, Precision p, bool checkpointing) {
  MemoryEstimate e;
  const int64_t n = s.num_params();
  e.weights = 4 * n;
  e.grads = 4 * n;
  e.optimizer = 8 * n;
  const int64_t act = p == Precision::kFp32 ? 4 : 2;  // bytes of an activation element under autocast
  const int64_t tokens = B * T;
  // Tensors saved for backward per token of one decoder layer (counted from the layer's ops):
  // residual inputs and norm statistics in fp32, normalised inputs, q/k/v and their rotated
  // copies, attention output, gate/up/activation/product of the SwiGLU.
  const int64_t kv = s.arch == Arch::kLlama ? s.n_kv_head * s.head_dim() : 0;
  // ResNet-BK: norms and projections, fp32 sweeps (a, b, c, and complex r, s, G per head), and
  // top_k expert inputs and SwiGLU intermediates per token (capacity slack not counted).
  const int64_t per_token_layer =
      s.arch == Arch::kLlama
          ? 2 * 4 * s.d_model + act * (2 * s.d_model + 3 * (s.d_model + 2 * kv) + s.d_model) + act * 4 * s.padded_d_ff()
      : s.arch == Arch::kResNetBk ? 2 * 4 * s.d_model + act * 2 * s.d_model + s.n_head * (3 * 4 + 3 * 8 + 2 * 4) +
                                        s.top_k * act * (s.d_model + 4 * s.d_ff)
                                  : 4 * s.d_model + act * (s.d_model + 2 * s.padded_d_ff());
  const int64_t per_layer = tokens * per_token_layer;
  const int64_t layer_input = tokens * s.d_model * 4;
  e.activations = checkpointing ? s.n_layer * layer_input + per_layer : s.n_layer * per_layer;
  // Logits in the compute dtype, their fp32 copy for the loss, and its gradient.
  e.logits = tokens * s.padded_vocab() * (act + 4 + 4);
  return e;
}

}  // namespace tandem
