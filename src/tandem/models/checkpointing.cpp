#include "tandem/models/checkpointing.h"

#include <ATen/autocast_mode.h>

#include <algorithm>

namespace tandem {
namespace {

// Note [Checkpoint recompute]
// The recompute runs inside the autograd engine's backward, on whichever thread the engine uses
// for the device; autocast state is thread-local, so the forward's state is captured here and
// restored around the recompute. The Block has no randomness (no dropout), so no RNG state
// needs replaying. The inner backward is re-entrant: it accumulates the Block's parameter
// gradients directly and hands back the input gradient. Where the Block's input needs no gradient
// but a parameter does (a frozen embedding before it), the Function takes a detached copy of the
// input that does, so backward still reaches the Block; that copy's gradient goes nowhere. (The
// parameters are not inputs of the Function: the autograd engine would then call their gradient
// hooks, which the offload engine and the gradient reducer count on, a second time.)
struct AutocastState {
  bool cuda = false, cpu = false;
  at::ScalarType cuda_dtype = at::kHalf, cpu_dtype = at::kBFloat16;
  static AutocastState capture() {
    AutocastState s;
    s.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cpu = at::autocast::is_autocast_enabled(at::kCPU);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    return s;
  }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
  }
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, Block* block) {
    const AutocastState s = AutocastState::capture();
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    ctx->saved_data["ac_cuda"] = s.cuda;
    ctx->saved_data["ac_cpu"] = s.cpu;
    ctx->saved_data["ac_cuda_dtype"] = static_cast<int64_t>(s.cuda_dtype);
    ctx->saved_data["ac_cpu_dtype"] = static_cast<int64_t>(s.cpu_dtype);
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return block->forward(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* block = reinterpret_cast<Block*>(ctx->saved_data["block"].toInt());
    AutocastState s;
    s.cuda = ctx->saved_data["ac_cuda"].toBool();
    s.cpu = ctx->saved_data["ac_cpu"].toBool();
    s.cuda_dtype = static_cast<at::ScalarType>(ctx->saved_data["ac_cuda_dtype"].toInt());
    s.cpu_dtype = static_cast<at::ScalarType>(ctx->saved_data["ac_cpu_dtype"].toInt());
    const AutocastState outer = AutocastState::capture();
    torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      s.apply();
      y = block->forward(x);
      outer.apply();
      if (s.cuda || s.cpu) at::autocast::clear_cache();
    }
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpointed_forward(Block& block, const torch::Tensor& x) {
  if (!x.requires_grad() && torch::GradMode::is_enabled()) {
    const auto params = block.parameters();
    if (std::any_of(params.begin(), params.end(), [](const torch::Tensor& p) { return p.requires_grad(); }))
      return CheckpointFunction::apply(x.detach().requires_grad_(x.is_floating_point()), &block);
  }
  return CheckpointFunction::apply(x, &block);
}

}  // namespace tandem
