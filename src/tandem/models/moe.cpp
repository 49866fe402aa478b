#include "tandem/models/moe.h"

#include <cmath>

#include "tandem/core/error.h"

namespace tandem {

MoeLayerImpl::MoeLayerImpl(const MoeOptions& o) : options_(o) {
  TANDEM_CHECK(o.n_experts >= 1 && o.top_k >= 1 && o.top_k <= o.n_experts,
               "MoE: need 1 <= top_k <= n_experts, got top_k ", o.top_k, " of ", o.n_experts, " experts");
  TANDEM_CHECK(o.capacity_factor > 0, "MoE: capacity_factor must be > 0, got ", o.capacity_factor);
  router = register_module("router", torch::nn::Linear(torch::nn::LinearOptions(o.d_model, o.n_experts).bias(false)));
  const double s_in = 1.0 / std::sqrt(double(o.d_model)), s_ff = 1.0 / std::sqrt(double(o.d_ff));
  w_gate = register_parameter("experts_gate_proj", torch::randn({o.n_experts, o.d_model, o.d_ff}) * s_in);
  w_up = register_parameter("experts_up_proj", torch::randn({o.n_experts, o.d_model, o.d_ff}) * s_in);
  w_down = register_parameter("experts_down_proj", torch::randn({o.n_experts, o.d_ff, o.d_model}) * s_ff);
}

torch::Tensor MoeLayerImpl::forward(const torch::Tensor& x_in) {
  const int64_t C = options_.d_model, E = options_.n_experts, K = options_.top_k;
  TANDEM_CHECK(x_in.size(-1) == C, "MoE: input has ", x_in.size(-1), " features, the layer takes ", C);
  const auto x = x_in.reshape({-1, C});  // (N, C)
  const int64_t N = x.size(0);
  const int64_t capacity =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(options_.capacity_factor * double(N * K) / double(E))));

  // Routing in fp32 (fp64 for fp64 inputs) whatever the autocast dtype.
  const auto route_t = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto probs = torch::softmax(router(x).to(route_t), -1);  // (N, E)
  auto [top_p, top_e] = probs.topk(K, -1);                       // (N, K)
  const auto gates = top_p / top_p.sum(-1, true);                // renormalised over the chosen

  // Note [MoE dispatch without per-token loops]
  const auto expert = top_e.reshape({-1});                          // (N*K) choice-major per token
  const auto onehot = torch::one_hot(expert, E).to(torch::kInt32);  // (N*K, E)
  const auto slot = (onehot.cumsum(0) - onehot).gather(1, expert.unsqueeze(1)).squeeze(1);  // position in expert
  const auto keep = slot < capacity;
  const auto kept = keep.nonzero().squeeze(1);  // (M)
  const auto token = torch::arange(N, expert.options()).repeat_interleave(K).index_select(0, kept);
  const auto flat_slot = expert.index_select(0, kept) * capacity + slot.index_select(0, kept).to(torch::kInt64);

  auto buf = torch::zeros({E * capacity, C}, x.options());
  buf = buf.index_copy(0, flat_slot, x.index_select(0, token));
  const auto xb = buf.view({E, capacity, C});
  const auto wg = w_gate.to(x.scalar_type()), wu = w_up.to(x.scalar_type()), wd = w_down.to(x.scalar_type());
  const auto h = torch::silu(torch::bmm(xb, wg)) * torch::bmm(xb, wu);  // (E, cap, F)
  const auto yb = torch::bmm(h, wd).reshape({E * capacity, C});
  const auto g = gates.reshape({-1}).index_select(0, kept).to(yb.scalar_type()).unsqueeze(1);
  auto out = torch::zeros({N, C}, yb.options()).index_add(0, token, yb.index_select(0, flat_slot) * g);

  // Load balance (Switch Transformer): f_e over all top-k assignments, P_e the mean probability.
  const auto f = onehot.to(route_t).mean(0);  // (E), sums to 1
  aux_loss_ = double(E) * (f.detach() * probs.mean(0)).sum();
  dropped_ = 1.0 - keep.to(torch::kFloat32).mean();
  return out.to(x_in.scalar_type()).view(x_in.sizes());
}

}  // namespace tandem
