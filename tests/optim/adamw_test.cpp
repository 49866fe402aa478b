#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "tandem/optim/optimizer.h"

namespace tandem {
namespace {

// 100 steps of FusedAdamW against LibTorch's reference torch::optim::AdamW on random gradients,
// with the same weight-decay split (matrices decay, vectors do not).
TEST(FusedAdamW, MatchesTorchOptimAdamWFor100Steps) {
  torch::manual_seed(5);
  auto w = torch::randn({17, 7}).requires_grad_(true);
  auto b = torch::randn({7}).requires_grad_(true);
  auto w_ref = w.detach().clone().requires_grad_(true);
  auto b_ref = b.detach().clone().requires_grad_(true);
  AdamWOptions o;
  o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8, o.weight_decay = 0.1;
  FusedAdamW ours({{"w", w}, {"b", b}}, o);
  const double lr = 1e-2;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{w_ref},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{b_ref},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  torch::optim::AdamW ref(groups, torch::optim::AdamWOptions(lr));
  for (int step = 0; step < 100; ++step) {
    auto gw = torch::randn_like(w), gb = torch::randn_like(b);
    w.mutable_grad() = gw.clone();
    b.mutable_grad() = gb.clone();
    w_ref.mutable_grad() = gw.clone();
    b_ref.mutable_grad() = gb.clone();
    ours.step(lr);
    ref.step();
  }
  EXPECT_TRUE(test::AllClose(w, w_ref, 1e-5, 1e-6));
  EXPECT_TRUE(test::AllClose(b, b_ref, 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(w, b_ref.expand_as(w)));
}

TEST(FusedAdamW, FoundInfSkipsTheUpdateAndKeepsTheStepCount) {
  auto w = torch::ones({4}).requires_grad_(true);
  FusedAdamW opt({{"w", w}}, AdamWOptions{});
  w.mutable_grad() = torch::ones({4});
  opt.step(0.1, torch::ones({}));
  EXPECT_TRUE(torch::equal(w, torch::ones({4})));
  auto st = opt.state();
  EXPECT_EQ(st[2].first, "w.step");
  EXPECT_EQ(st[2].second.item<float>(), 0.0f);
  opt.step(0.1, torch::zeros({}));
  EXPECT_FALSE(torch::equal(w, torch::ones({4})));
  EXPECT_EQ(opt.state()[2].second.item<float>(), 1.0f);
}

TEST(FusedAdamW, StateRoundTrip) {
  auto w = torch::randn({3, 3}).requires_grad_(true);
  FusedAdamW a({{"w", w}}, AdamWOptions{});
  w.mutable_grad() = torch::randn({3, 3});
  a.step(0.01);
  std::map<std::string, torch::Tensor> saved;
  for (auto& [n, t] : a.state()) saved[n] = t.clone();
  auto w2 = w.detach().clone().requires_grad_(true);
  FusedAdamW b({{"w", w2}}, AdamWOptions{});
  b.load_state([&](const std::string& n) -> std::optional<torch::Tensor> { return saved.at(n); }, "mem");
  auto g = torch::randn({3, 3});
  w.mutable_grad() = g.clone();
  w2.mutable_grad() = g.clone();
  a.step(0.01);
  b.step(0.01);
  EXPECT_TRUE(torch::equal(w, w2));
}

}  // namespace
}  // namespace tandem
