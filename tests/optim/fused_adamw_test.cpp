// FusedAdamW (optim/optimizer.h) beyond its AdamW path: plain Adam (L2 decay) against
// torch::optim::Adam, decay of 1-D parameters on request, unused parameters that still decay, the
// state it exposes, zero_grad, and a skipped step across both decay groups.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <map>
#include <set>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/optim/optimizer.h"

namespace tandem {
namespace {

constexpr double kF32Eps = std::numeric_limits<float>::epsilon();

AdamWOptions options(double wd, bool decoupled, bool decay_1d) {
  AdamWOptions o;
  o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8, o.weight_decay = wd, o.decoupled = decoupled, o.decay_1d = decay_1d;
  return o;
}

// 50 steps against a LibTorch optimizer with one group per decay setting.
template <class TorchOpt, class TorchOptions>
void compare_with_torch(const AdamWOptions& o, double wd_1d) {
  torch::manual_seed(5);
  auto w = torch::randn({17, 7}).requires_grad_(true);
  auto b = torch::randn({7}).requires_grad_(true);
  auto w_ref = w.detach().clone().requires_grad_(true);
  auto b_ref = b.detach().clone().requires_grad_(true);
  FusedAdamW ours({{"w", w}, {"b", b}}, o);
  const double lr = 1e-2;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{w_ref},
      std::make_unique<TorchOptions>(TorchOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(o.weight_decay)));
  groups.emplace_back(
      std::vector<torch::Tensor>{b_ref},
      std::make_unique<TorchOptions>(TorchOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd_1d)));
  TorchOpt ref(groups, TorchOptions(lr));
  for (int step = 0; step < 50; ++step) {
    const auto gw = torch::randn_like(w), gb = torch::randn_like(b);
    w.mutable_grad() = gw.clone(), b.mutable_grad() = gb.clone();
    w_ref.mutable_grad() = gw.clone(), b_ref.mutable_grad() = gb.clone();
    ours.step(lr);
    ref.step();
  }
  EXPECT_TRUE(test::AllClose(w, w_ref, 1e-5, 1e-6));
  EXPECT_TRUE(test::AllClose(b, b_ref, 1e-5, 1e-6));
}

TEST(FusedAdamW, WithoutDecouplingItIsAdamWithL2DecayOnMatricesOnly) {
  // A large decay, so that L2 and decoupled decay part ways within 50 steps.
  compare_with_torch<torch::optim::Adam, torch::optim::AdamOptions>(options(0.5, false, false), 0.0);
}

TEST(FusedAdamW, Decay1dDecaysVectorsToo) {
  compare_with_torch<torch::optim::AdamW, torch::optim::AdamWOptions>(options(0.3, true, true), 0.3);
  compare_with_torch<torch::optim::Adam, torch::optim::AdamOptions>(options(0.3, false, true), 0.3);
}

TEST(FusedAdamW, AParameterWithoutAGradientStillDecays) {
  torch::manual_seed(6);
  auto w = torch::randn({9, 5}).requires_grad_(true), b = torch::randn({5}).requires_grad_(true);
  const auto w0 = w.detach().clone(), b0 = b.detach().clone();
  FusedAdamW opt({{"w", w}, {"b", b}}, options(0.1, true, false));
  const double lr = 0.05;
  opt.step(lr);  // neither has a .grad
  EXPECT_TRUE(test::AllClose(w, w0.to(torch::kFloat64) * (1 - lr * 0.1), 4 * kF32Eps, 0));
  EXPECT_TRUE(torch::equal(b, b0)) << "an undecayed parameter without a gradient moved";
  EXPECT_FALSE(w.grad().defined()) << "the zero gradient was left on the parameter";
}

TEST(FusedAdamW, StateNamesEveryParametersMomentsAndStep) {
  torch::manual_seed(7);
  auto w = torch::randn({4, 3}).requires_grad_(true), b = torch::randn({3}).requires_grad_(true);
  FusedAdamW opt({{"layer.b", b}, {"layer.w", w}}, options(0.1, true, false));
  std::map<std::string, torch::Tensor> st;
  for (auto& [n, t] : opt.state()) EXPECT_TRUE(st.emplace(n, t).second) << n << " twice";
  EXPECT_EQ(st.size(), 6u);
  for (const char* p : {"layer.w", "layer.b"}) {
    const auto& param = std::string(p) == "layer.w" ? w : b;
    for (const char* suffix : {".exp_avg", ".exp_avg_sq", ".step"}) ASSERT_TRUE(st.count(p + std::string(suffix)));
    EXPECT_EQ(st.at(p + std::string(".exp_avg")).sizes(), param.sizes());
    EXPECT_EQ(st.at(p + std::string(".exp_avg_sq")).sizes(), param.sizes());
    EXPECT_EQ(st.at(p + std::string(".step")).dim(), 0);
  }
  // The state is live: after one step the moments are (1 - beta) g and (1 - beta2) g^2.
  const auto gw = torch::randn({4, 3}), gb = torch::randn({3});
  w.mutable_grad() = gw, b.mutable_grad() = gb;
  opt.step(1e-3);
  const double tol = 4 * kF32Eps;
  EXPECT_TRUE(test::AllClose(st.at("layer.w.exp_avg"), 0.1 * gw.to(torch::kFloat64), tol, 0));
  EXPECT_TRUE(test::AllClose(st.at("layer.b.exp_avg"), 0.1 * gb.to(torch::kFloat64), tol, 0));
  EXPECT_TRUE(test::AllClose(st.at("layer.w.exp_avg_sq"), 0.05 * gw.to(torch::kFloat64).pow(2), tol, 0));
  EXPECT_EQ(st.at("layer.w.step").item<float>(), 1.0f);
  EXPECT_EQ(st.at("layer.b.step").item<float>(), 1.0f);
}

TEST(FusedAdamW, ZeroGradDropsEveryGradient) {
  auto w = torch::randn({4, 3}).requires_grad_(true), b = torch::randn({3}).requires_grad_(true);
  FusedAdamW opt({{"w", w}, {"b", b}}, options(0.1, true, false));
  w.mutable_grad() = torch::ones({4, 3}), b.mutable_grad() = torch::ones({3});
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(FusedAdamW, ASkippedStepChangesNothingInEitherGroup) {
  torch::manual_seed(8);
  auto w = torch::randn({6, 5}).requires_grad_(true), b = torch::randn({5}).requires_grad_(true);
  const auto w0 = w.detach().clone(), b0 = b.detach().clone();
  FusedAdamW opt({{"w", w}, {"b", b}}, options(0.1, true, false));
  w.mutable_grad() = torch::randn({6, 5}), b.mutable_grad() = torch::randn({5});
  opt.step(0.1, torch::ones({}));
  EXPECT_TRUE(torch::equal(w, w0));
  EXPECT_TRUE(torch::equal(b, b0));
  for (auto& [n, t] : opt.state()) EXPECT_TRUE(t.eq(0).all().item<bool>()) << n << " changed on a skipped step";
  opt.step(0.1, torch::zeros({}));
  EXPECT_FALSE(torch::equal(w, w0));
  EXPECT_FALSE(torch::equal(b, b0));
  for (auto& [n, t] : opt.state()) {
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".step") == 0) {
      EXPECT_EQ(t.item<float>(), 1.0f) << n;
    }
  }
}

TEST(FusedAdamW, AParameterThatDoesNotRequireGradIsABug) {
  EXPECT_THROW(FusedAdamW({{"frozen", torch::zeros({3, 3})}}, AdamWOptions{}), InternalError);
  FusedAdamW none({}, AdamWOptions{});
  EXPECT_NO_THROW(none.step(1e-3));
  EXPECT_TRUE(none.state().empty());
}

}  // namespace
}  // namespace tandem
