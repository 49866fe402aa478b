#include "tandem/run/resident_update.h"

#include "tandem/optim/optimizer.h"

namespace tandem {

torch::Tensor resident_update(std::vector<torch::Tensor>& params, Optimizer& optimizer, double lr, double grad_clip,
                              const std::optional<torch::Tensor>& scale, torch::Tensor& found_inf,
                              const std::function<torch::Tensor(const torch::Tensor&)>& global_norm) {
  std::vector<torch::Tensor> grads;
  for (auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (scale) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, scale->reciprocal());
  // Global norm of all gradients, without a host synchronisation.
  torch::Tensor norm = grads.empty() ? torch::zeros({}, found_inf.options())
                                     : torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2)), 2);
  if (global_norm) norm = global_norm(norm);
  found_inf = torch::maximum(found_inf, (~torch::isfinite(norm)).to(torch::kFloat32));
  if (grad_clip > 0 && !grads.empty()) {  // the global norm's coefficient on every stage
    auto coef = torch::clamp_max(grad_clip / (norm + 1e-6), 1.0);
    at::_foreach_mul_(grads, coef);
  }
  optimizer.step(lr, found_inf);
  optimizer.zero_grad();
  return norm;
}

void update_loss_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                       const ScalerConfig& sc) {
  if (!sc.dynamic) return;
  at::_amp_update_scale_(scale, growth_tracker, found_inf, sc.growth_factor, sc.backoff_factor, sc.growth_interval);
  scale.clamp_min_(sc.min_scale);
}

}  // namespace tandem
