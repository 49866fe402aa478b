#include "tandem/core/error.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

FusedAdamW::FusedAdamW(std::vector<NamedTensor> params, AdamWOptions options) : options_(options) {
  groups_.resize(2);
  groups_[0].weight_decay = options_.weight_decay;
  groups_[1].weight_decay = 0.0;
  for (auto& [name, p] : params) {
    TANDEM_ASSERT(p.requires_grad(), "parameter ", name, " does not require grad");
    auto& g = groups_[p.dim() >= 2 || options_.decay_1d ? 0 : 1];
    g.names.push_back(name);
    g.params.push_back(p);
    g.exp_avg.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    g.exp_avg_sq.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    g.steps.push_back(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(p.device())));
  }
}

void FusedAdamW::step(double lr, const std::optional<torch::Tensor>& found_inf) {
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) {
    if (g.params.empty()) continue;
    std::vector<torch::Tensor> grads;
    grads.reserve(g.params.size());
    for (auto& p : g.params) {
      auto gr = p.grad();
      if (!gr.defined()) gr = torch::zeros_like(p);  // a parameter unused this step still decays
      grads.push_back(gr);
    }
    // The fused kernel expects the step counters already incremented (as torch.optim does) and,
    // when it skips for found_inf, they are rolled back to keep bias correction exact.
    at::_foreach_add_(g.steps, 1);
    if (options_.decoupled) {
      at::_fused_adamw_(g.params, grads, g.exp_avg, g.exp_avg_sq, /*max_exp_avg_sqs=*/{}, g.steps, lr, options_.beta1,
                        options_.beta2, g.weight_decay, options_.eps, /*amsgrad=*/false,
                        /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
    } else {
      at::_fused_adam_(g.params, grads, g.exp_avg, g.exp_avg_sq, /*max_exp_avg_sqs=*/{}, g.steps, lr, options_.beta1,
                       options_.beta2, g.weight_decay, options_.eps, false, false, std::nullopt, found_inf);
    }
    if (found_inf) at::_foreach_sub_(g.steps, std::vector<torch::Tensor>(g.steps.size(), *found_inf));
  }
}

void FusedAdamW::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.mutable_grad() = torch::Tensor();
}

std::vector<NamedTensor> FusedAdamW::state() {
  std::vector<NamedTensor> out;
  for (auto& g : groups_) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      out.emplace_back(g.names[i] + ".exp_avg", g.exp_avg[i]);
      out.emplace_back(g.names[i] + ".exp_avg_sq", g.exp_avg_sq[i]);
      out.emplace_back(g.names[i] + ".step", g.steps[i]);
    }
  }
  return out;
}

}  // namespace tandem
