#pragma once
// A first memory estimate per device for a run without the offload engine: weights, gradients,
// optimizer states, activations and logits. The offload engine's MemoryPlan replaces it with
// an exact per-buffer plan.

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/models/spec.h"

namespace tandem {

/// Bytes by purpose on the compute device.
struct MemoryEstimate {
  int64_t weights = 0, grads = 0, optimizer = 0, activations = 0, logits = 0;
  int64_t total() const { return weights + grads + optimizer + activations + logits; }
  std::vector<std::pair<std::string, int64_t>> rows() const;
};

/// Estimate for training `spec` with micro-batch B, sequence T, precision and checkpointing.
MemoryEstimate estimate_training_memory(const ModelSpec& spec, int64_t micro_batch, int64_t seq_len, Precision p,
                                        bool checkpointing);

/// What one micro-batch's forward leaves for backward, per decoder layer, and the logits.
struct ActivationCost {
  int64_t kept_per_layer = 0;  ///< held until the layer's backward (its input alone with checkpointing)
  int64_t layer_working = 0;   ///< one layer's saved tensors while it is recomputed (checkpointing), else 0
  int64_t logits = 0;          ///< logits in the compute dtype, their fp32 copy for the loss, its gradient
  /// `layers` decoder layers of `in_flight` micro-batches at once (pipeline stages hold several).
  int64_t activations(int64_t layers, int64_t in_flight) const;
};
ActivationCost activation_cost(const ModelSpec& spec, int64_t micro_batch, int64_t seq_len, Precision p,
                               bool checkpointing);

}  // namespace tandem
