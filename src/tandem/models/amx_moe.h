#pragma once
// Seed 000's model as Blocks: dense MLP layers ("AMX" layers, for the CPU's matrix units; they are
// MlpLayer) feeding Mixture-of-Experts layers (for the GPU), Arch::kAmxMoe.

#include "tandem/models/block.h"
#include "tandem/models/moe.h"
#include "tandem/models/norm.h"
#include "tandem/models/spec.h"

namespace tandem {

/// A pre-norm residual MoE feed-forward layer: x + moe(norm(x)), with the MoE load-balance loss.
class MoeFfnLayer : public Block {
 public:
  MoeFfnLayer(const ModelSpec& spec, int64_t index);
  torch::Tensor forward(const torch::Tensor& x) override;
  /// The load-balance loss of the last forward (on the device the layer ran on).
  const torch::Tensor& aux_loss() const { return moe_->last_aux_loss(); }

 private:
  Norm norm_{nullptr};
  MoeLayer moe_{nullptr};
};

}  // namespace tandem
