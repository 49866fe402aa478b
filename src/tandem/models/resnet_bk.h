#pragma once
// ResNet-BK decoder layer: a BK-core mixing sublayer and a Mixture-of-Experts feed-forward, each
// behind an RMSNorm and a residual connection.
//
// Note [ResNet-BK mixing]
// Per layer and head k, the sequence defines a tridiagonal H: the main diagonal a_t and the
// couplings b_t, c_t (between t-1 and t) are learned projections of token t (b, c through softplus,
// so b c > 0 and H has a real spectrum), and z_k = x_k + i (softplus(y_k) + 0.05) keeps the shift
// off that spectrum. The layer reads the causal BK-core diagonal (BkCoreDiagonal::kCausal: entry t
// depends on tokens <= t only, as a decoder requires), splits it into real and imaginary parts and
// projects the 2K features back to d_model. The sweeps run in fp32 (complex64) under any autocast.

#include "tandem/models/block.h"
#include "tandem/models/moe.h"
#include "tandem/models/norm.h"
#include "tandem/models/spec.h"

namespace tandem {

/// One ResNet-BK decoder layer: x + bk(norm(x)), then h + moe(norm(h)).
class ResNetBkLayer : public Block {
 public:
  ResNetBkLayer(const ModelSpec& spec, int64_t index);
  torch::Tensor forward(const torch::Tensor& x) override;
  /// The MoE load-balance loss of the last forward.
  const torch::Tensor& aux_loss() const { return moe_->last_aux_loss(); }

 private:
  int64_t heads_;
  Norm norm1_{nullptr}, norm2_{nullptr};
  torch::nn::Linear in_proj_{nullptr}, out_proj_{nullptr};
  torch::Tensor z_re_, z_im_;  // (K)
  MoeLayer moe_{nullptr};
};

}  // namespace tandem
