#include "tandem/models/norm.h"

namespace tandem {

NormImpl::NormImpl(int64_t dim, double eps, NormKind kind) : dim_(dim), eps_(eps), kind_(kind) {
  weight = register_parameter("weight", kind == NormKind::kRmsPlusOne ? torch::zeros({dim}) : torch::ones({dim}));
  if (kind == NormKind::kLayerNorm) bias = register_parameter("bias", torch::zeros({dim}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  const auto as_x = [&](const torch::Tensor& t) {
    return t.scalar_type() == x.scalar_type() ? t : t.to(x.scalar_type());
  };
  switch (kind_) {
    case NormKind::kRms:
      return at::rms_norm(x, {dim_}, as_x(weight), eps_);
    case NormKind::kRmsPlusOne:  // Gemma: in fp32 with the scale 1 + w, rounded once (as transformers computes it)
      return at::rms_norm(x.to(torch::kFloat32), {dim_}, 1 + weight.to(torch::kFloat32), eps_).to(x.scalar_type());
    case NormKind::kLayerNorm:
      return at::layer_norm(x, {dim_}, as_x(weight), as_x(bias), eps_);
  }
  return x;
}

torch::Tensor norm_fp32(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                        NormKind kind) {
  const auto x32 = x.to(torch::kFloat32);
  const auto w = weight.to(torch::kFloat32);
  switch (kind) {
    case NormKind::kRms:
      return at::rms_norm(x32, {x.size(-1)}, w, eps);
    case NormKind::kRmsPlusOne:
      return at::rms_norm(x32, {x.size(-1)}, 1 + w, eps);
    case NormKind::kLayerNorm:
      return at::layer_norm(x32, {x.size(-1)}, w, bias.to(torch::kFloat32), eps);
  }
  return x32;
}

}  // namespace tandem
