#include "tandem/models/moe.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"

namespace tandem {
namespace {

// The layer, token by token, with the same first-come capacity rule.
torch::Tensor loop_reference(MoeLayer& moe, const torch::Tensor& x, int64_t capacity) {
  const auto& o = moe->options();
  torch::NoGradGuard no_grad;
  const auto probs = torch::softmax(moe->router(x), -1);
  auto [top_p, top_e] = probs.topk(o.top_k, -1);
  const auto gates = top_p / top_p.sum(-1, true);
  std::vector<int64_t> used(o.n_experts, 0);
  auto out = torch::zeros_like(x);
  for (int64_t t = 0; t < x.size(0); ++t)
    for (int64_t k = 0; k < o.top_k; ++k) {
      const int64_t e = top_e[t][k].item<int64_t>();
      if (used[e]++ >= capacity) continue;
      const auto h = torch::silu(x[t].matmul(moe->w_gate[e])) * x[t].matmul(moe->w_up[e]);
      out[t] += gates[t][k] * h.matmul(moe->w_down[e]);
    }
  return out;
}

TEST(Moe, BatchedDispatchEqualsTheTokenLoop) {
  torch::manual_seed(0);
  for (double factor : {100.0, 0.3}) {  // ample capacity, then one that drops
    MoeOptions o;
    o.d_model = 16, o.d_ff = 24, o.n_experts = 4, o.top_k = 2, o.capacity_factor = factor;
    MoeLayer moe(o);
    moe->to(torch::kFloat64);
    const auto x = torch::randn({2, 13, 16}, torch::kFloat64);
    const auto y = moe->forward(x);
    const int64_t N = 26, capacity = std::max<int64_t>(1, int64_t(std::ceil(factor * N * 2 / 4)));
    EXPECT_TRUE(test::AllClose(y.reshape({N, 16}), loop_reference(moe, x.reshape({N, 16}), capacity), 1e-12, 1e-12))
        << "capacity factor " << factor;
    const double dropped = moe->last_dropped_fraction().item<double>();
    if (factor > 10)
      EXPECT_EQ(dropped, 0.0);
    else
      EXPECT_GT(dropped, 0.0);
  }
}

TEST(Moe, LoadBalanceLossIsOneForAUniformRouterAndGradientsFlow) {
  MoeOptions o;
  o.d_model = 8, o.d_ff = 16, o.n_experts = 4, o.top_k = 1;
  MoeLayer moe(o);
  {
    torch::NoGradGuard no_grad;
    moe->router->weight.zero_();
  }
  moe->forward(torch::randn({10, 8}));
  EXPECT_NEAR(moe->last_aux_loss().item<double>(), 1.0, 1e-6);
  torch::manual_seed(1);
  MoeLayer moe2(o);
  const auto y = moe2->forward(torch::randn({4, 10, 8}));
  (y.square().mean() + 0.01 * moe2->last_aux_loss()).backward();
  EXPECT_GT(moe2->router->weight.grad().abs().sum().item<double>(), 0.0);
  EXPECT_GT(moe2->w_down.grad().abs().sum().item<double>(), 0.0);
}

TEST(Moe, BadOptionsAreRefused) {
  MoeOptions o;
  o.d_model = 8, o.d_ff = 8, o.n_experts = 2, o.top_k = 3;
  EXPECT_NE(test::error_of([&] { MoeLayer m(o); }).find("top_k <= n_experts"), std::string::npos);
}

}  // namespace
}  // namespace tandem
