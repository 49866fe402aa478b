#include "tandem/models/resnet_bk.h"

#include <cmath>

#include "tandem/kernels/bk_core.h"

namespace tandem {

ResNetBkLayer::ResNetBkLayer(const ModelSpec& spec, int64_t index)
    : Block(BlockKind::kLayer, "layer." + std::to_string(index), "model.layers." + std::to_string(index) + "."),
      heads_(spec.n_head) {
  const double std_in = 0.02, std_out = 0.02 / std::sqrt(2.0 * spec.n_layer);
  norm1_ = register_module("input_layernorm", Norm(spec.d_model, spec.norm_eps));
  norm2_ = register_module("post_mixing_layernorm", Norm(spec.d_model, spec.norm_eps));
  auto bk = register_module("bk", std::make_shared<torch::nn::Module>());
  in_proj_ =
      bk->register_module("in_proj", torch::nn::Linear(torch::nn::LinearOptions(spec.d_model, 3 * heads_).bias(true)));
  out_proj_ = bk->register_module("out_proj",
                                  torch::nn::Linear(torch::nn::LinearOptions(2 * heads_, spec.d_model).bias(false)));
  {
    torch::NoGradGuard no_grad;
    in_proj_->weight.normal_(0, std_in);
    in_proj_->bias.zero_();
    out_proj_->weight.normal_(0, std_out);
  }
  z_re_ = bk->register_parameter("z_re", torch::linspace(-1.0, 1.0, heads_));
  z_im_ = bk->register_parameter("z_im", torch::zeros({heads_}));
  MoeOptions mo;
  mo.d_model = spec.d_model, mo.d_ff = spec.d_ff, mo.n_experts = spec.n_experts, mo.top_k = spec.top_k;
  mo.capacity_factor = spec.capacity_factor;
  moe_ = register_module("mlp", MoeLayer(mo));
}

torch::Tensor ResNetBkLayer::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), K = heads_;
  // Note [ResNet-BK mixing]
  const auto proj = in_proj_->forward(norm1_->forward(x)).to(torch::kFloat32);  // (B, T, 3K)
  const auto rows = [&](const torch::Tensor& t) { return t.permute({0, 2, 1}).reshape({B * K, -1}); };
  const auto a = rows(proj.narrow(2, 0, K));                                           // (B*K, T)
  const auto b = rows(torch::softplus(proj.narrow(2, K, K)).narrow(1, 1, T - 1));      // (B*K, T-1)
  const auto c = rows(torch::softplus(proj.narrow(2, 2 * K, K)).narrow(1, 1, T - 1));  // (B*K, T-1)
  const auto z = torch::complex(z_re_.to(torch::kFloat32), torch::softplus(z_im_.to(torch::kFloat32)) + 0.05)
                     .repeat({B});                                                   // (B*K), row b*K + k -> head k
  const auto g = bk_core(a, b, c, z, BkCoreMode::kNative, BkCoreDiagonal::kCausal);  // (B*K, T) complex64
  const auto feats = torch::stack({torch::real(g), torch::imag(g)}, -1)              // (B*K, T, 2)
                         .view({B, K, T, 2})
                         .permute({0, 2, 1, 3})
                         .reshape({B, T, 2 * K});
  const auto h = x + out_proj_->forward(feats);
  // Position-major order for the MoE's first-come capacity slots: whether a token keeps its slot
  // then depends on tokens at its own or earlier positions only (of any sequence in the batch),
  // never on later ones, so the layer stays causal even when experts overflow.
  return h + moe_->forward(norm2_->forward(h).transpose(0, 1)).transpose(0, 1);
}

}  // namespace tandem
