#pragma once
// The norms of the decoder families: RMSNorm (Llama), RMSNorm with a (1 + w) scale (Gemma) and
// LayerNorm with a bias (GPT-2).

#include <torch/torch.h>

#include "tandem/models/spec.h"

namespace tandem {

/// A norm over the last dimension with a learned scale (and a bias for LayerNorm). The scale starts
/// at ones (zeros for kRmsPlusOne, whose scale is 1 + w), the bias at zeros.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(int64_t dim, double eps, NormKind kind = NormKind::kRms);
  /// Computed in x's dtype with the scale converted to it: a low-precision scale (the offload
  /// engine's bf16 working copy) meets the fp32 residual stream in fp32, as an fp32 parameter would,
  /// so its gradient is reduced over tokens in fp32 and rounded once.
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;  // bias: LayerNorm only

 private:
  int64_t dim_;
  double eps_;
  NormKind kind_;
};
TORCH_MODULE(Norm);

/// The norm of `x` with the given scale (and bias), in fp32 whatever the dtypes (the generation
/// forward's norms, Note [Generation forward]).
torch::Tensor norm_fp32(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                        NormKind kind);

}  // namespace tandem
