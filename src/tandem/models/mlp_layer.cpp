#include "tandem/models/mlp_layer.h"

#include <cmath>

namespace tandem {

MlpLayer::MlpLayer(const ModelSpec& spec, int64_t index)
    : Block(BlockKind::kLayer, "layer." + std::to_string(index), "model.layers." + std::to_string(index) + "."),
      d_ff_(spec.d_ff) {
  constexpr double kInitStd = 0.02;
  norm_ = register_module("input_layernorm", Norm(spec.d_model, spec.norm_eps));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  const int64_t ff = spec.padded_d_ff();
  up_ = mlp->register_module("up_proj", Projection(spec.d_model, ff, kInitStd));
  down_ = mlp->register_module("down_proj", Projection(ff, spec.d_model, kInitStd / std::sqrt(2.0 * spec.n_layer)));
  up_->zero_outputs_from(spec.d_ff);  // Note [Zero padding keeps the function]
  down_->zero_inputs_from(spec.d_ff);
}

torch::Tensor MlpLayer::forward(const torch::Tensor& x) {
  return x + down_->forward(torch::gelu(up_->forward(norm_->forward(x))));
}

std::vector<int64_t> MlpLayer::hf_shape(const std::string& name, const torch::Tensor& param) const {
  auto shape = param.sizes().vec();
  if (param.is_same(up_->weight)) shape[0] = d_ff_;
  if (param.is_same(down_->weight)) shape[1] = d_ff_;
  (void)name;
  return shape;
}

}  // namespace tandem
