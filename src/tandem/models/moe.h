#pragma once
// A Mixture-of-Experts feed-forward layer: a linear router, top-k routing with renormalised gates,
// a capacity per expert, SwiGLU experts run as one batched matmul per projection, and the
// Switch-Transformer load-balance loss. Reusable by any model: (..., C) -> (..., C).

#include <torch/torch.h>

namespace tandem {

/// Shapes and routing of one MoE layer.
struct MoeOptions {
  int64_t d_model = 0;
  int64_t d_ff = 0;  ///< hidden size of each expert
  int64_t n_experts = 8;
  int64_t top_k = 2;
  double capacity_factor = 1.25;  ///< slots per expert = ceil(factor * tokens * top_k / n_experts)
};

/// Note [MoE dispatch without per-token loops]
/// Each (token, choice) pair gets its slot in its expert's buffer from a cumulative sum over a
/// one-hot (assignments, experts) matrix; pairs beyond the capacity are dropped (their token keeps
/// only its residual path and its other choices). Tokens are gathered into an (E, capacity, C)
/// buffer with one index_copy, every expert runs at once through bmm, and the outputs return to
/// their tokens with one index_add weighted by the gates. Shapes depend on the capacity only, so
/// the layer has no data-dependent shapes beyond the kept-pair count. Slots go first-come in the
/// order of the flattened leading dimensions: a decoder passes its tokens position-major, so a
/// token's slot never depends on a later position (ResNetBkLayer does).
class MoeLayerImpl : public torch::nn::Module {
 public:
  explicit MoeLayerImpl(const MoeOptions& options);
  /// x (..., C) -> (..., C); sets last_aux_loss() and last_dropped_fraction().
  torch::Tensor forward(const torch::Tensor& x);
  /// E * sum_e f_e * P_e of the last forward (f_e: fraction of assignments routed to e, P_e: mean
  /// router probability of e); 1.0 for perfectly balanced routing. Differentiable through P_e.
  const torch::Tensor& last_aux_loss() const { return aux_loss_; }
  /// Fraction of (token, choice) pairs dropped for capacity in the last forward (a 0-d tensor).
  const torch::Tensor& last_dropped_fraction() const { return dropped_; }
  const MoeOptions& options() const { return options_; }

  torch::nn::Linear router{nullptr};
  torch::Tensor w_gate, w_up, w_down;  // (E, C, F), (E, C, F), (E, F, C)

 private:
  MoeOptions options_;
  torch::Tensor aux_loss_, dropped_;
};
TORCH_MODULE(MoeLayer);

}  // namespace tandem
