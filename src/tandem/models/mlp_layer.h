#pragma once
// The `mlp` preset's layer: a residual MLP without attention.

#include "tandem/models/block.h"
#include "tandem/models/norm.h"
#include "tandem/models/projection.h"
#include "tandem/models/spec.h"

namespace tandem {

/// x + down(gelu(up(norm(x)))).
class MlpLayer : public Block {
 public:
  MlpLayer(const ModelSpec& spec, int64_t index);
  torch::Tensor forward(const torch::Tensor& x) override;
  std::vector<int64_t> hf_shape(const std::string& name, const torch::Tensor& param) const override;

 private:
  Norm norm_{nullptr};
  Projection up_{nullptr}, down_{nullptr};
  int64_t d_ff_;
};

}  // namespace tandem
