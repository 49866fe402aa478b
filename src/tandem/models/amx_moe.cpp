#include "tandem/models/amx_moe.h"

namespace tandem {

MoeFfnLayer::MoeFfnLayer(const ModelSpec& spec, int64_t index)
    : Block(BlockKind::kLayer, "layer." + std::to_string(index), "model.layers." + std::to_string(index) + ".") {
  norm_ = register_module("input_layernorm", Norm(spec.d_model, spec.norm_eps));
  MoeOptions o;
  o.d_model = spec.d_model;
  o.d_ff = spec.d_ff;
  o.n_experts = spec.n_experts;
  o.top_k = spec.top_k;
  o.capacity_factor = spec.capacity_factor;
  moe_ = register_module("mlp", MoeLayer(o));
}

torch::Tensor MoeFfnLayer::forward(const torch::Tensor& x) { return x + moe_->forward(norm_->forward(x)); }

}  // namespace tandem
