// The update of device-resident parameters (run/resident_update.h) on the CPU: global norm, clipping,
// fp16 unscaling with the non-finite check, the pipeline's norm hook, the optimizer stepped with the
// skip flag and its gradients cleared; and the dynamic loss scale's backoff, growth and floor.
#include "tandem/run/resident_update.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "../test_util.h"
#include "tandem/optim/optimizer.h"

namespace tandem {
namespace {

/// Records what the update hands the optimizer: the gradients at the step (copies), lr and found_inf.
class RecordingOptimizer : public Optimizer {
 public:
  explicit RecordingOptimizer(std::vector<torch::Tensor> params) : params_(std::move(params)) {}
  void step(double lr, const std::optional<torch::Tensor>& found_inf) override {
    ++steps;
    this->lr = lr;
    this->found_inf = found_inf ? found_inf->item<double>() : -1.0;
    grads.clear();
    for (auto& p : params_) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  void zero_grad() override {
    ++zeroed;
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  }
  std::vector<NamedTensor> state() override { return {}; }

  int steps = 0, zeroed = 0;
  double lr = 0, found_inf = -2;
  std::vector<torch::Tensor> grads;

 private:
  std::vector<torch::Tensor> params_;
};

struct Rig {
  std::vector<torch::Tensor> params{torch::zeros({2}).requires_grad_(true), torch::zeros({1}).requires_grad_(true)};
  RecordingOptimizer optimizer{params};
  torch::Tensor found_inf = torch::zeros({}, torch::kFloat32);

  void set_grads(std::vector<float> a, std::vector<float> b) {
    params[0].mutable_grad() = torch::tensor(a);
    params[1].mutable_grad() = torch::tensor(b);
  }
};

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(ResidentUpdate, TheNormCoversEveryGradientAndTheOptimizerStepsOnce) {
  Rig r;
  r.set_grads({3, 4}, {12});
  const torch::Tensor norm = resident_update(r.params, r.optimizer, 0.25, 0.0, std::nullopt, r.found_inf);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_NEAR(norm.item<double>(), 13.0, 1e-5) << "sqrt(9 + 16 + 144)";
  EXPECT_EQ(r.found_inf.item<float>(), 0.0f);
  EXPECT_EQ(r.optimizer.steps, 1);
  EXPECT_EQ(r.optimizer.lr, 0.25);
  EXPECT_EQ(r.optimizer.found_inf, 0.0) << "the skip flag is passed, and clear";
  ASSERT_EQ(r.optimizer.grads.size(), 2u);
  EXPECT_TRUE(torch::equal(r.optimizer.grads[0], torch::tensor({3.0f, 4.0f}))) << "grad_clip=0: unclipped";
  EXPECT_TRUE(torch::equal(r.optimizer.grads[1], torch::tensor({12.0f})));
  EXPECT_EQ(r.optimizer.zeroed, 1) << "the gradients are cleared after the step";
  EXPECT_FALSE(r.params[0].grad().defined());
}

TEST(ResidentUpdate, ClippingScalesEveryGradientByTheGlobalNorm) {
  Rig r;
  r.set_grads({3, 4}, {12});
  const torch::Tensor norm = resident_update(r.params, r.optimizer, 0.1, 6.5, std::nullopt, r.found_inf);
  EXPECT_NEAR(norm.item<double>(), 13.0, 1e-5) << "the norm before clipping";
  const double coef = 6.5 / (13.0 + 1e-6);
  EXPECT_TRUE(test::AllClose(r.optimizer.grads[0], torch::tensor({3.0, 4.0}) * coef, 1e-6, 0));
  EXPECT_TRUE(test::AllClose(r.optimizer.grads[1], torch::tensor({12.0}) * coef, 1e-6, 0));
  const double clipped = std::sqrt(r.optimizer.grads[0].square().sum().item<double>() +
                                   r.optimizer.grads[1].square().sum().item<double>());
  EXPECT_NEAR(clipped, 6.5, 1e-5);
}

TEST(ResidentUpdate, ANormUnderTheClipLeavesTheGradientsExactlyAsTheyWere) {
  Rig r;
  r.set_grads({0.3f, -0.4f}, {1.2f});
  resident_update(r.params, r.optimizer, 0.1, 100.0, std::nullopt, r.found_inf);
  EXPECT_TRUE(torch::equal(r.optimizer.grads[0], torch::tensor({0.3f, -0.4f})));
  EXPECT_TRUE(torch::equal(r.optimizer.grads[1], torch::tensor({1.2f})));
}

TEST(ResidentUpdate, Fp16GradientsAreUnscaledBeforeTheNormAndTheStep) {
  Rig r;
  r.set_grads({3 * 1024.0f, 4 * 1024.0f}, {12 * 1024.0f});
  const std::optional<torch::Tensor> scale = torch::full({1}, 1024.0f);
  const torch::Tensor norm = resident_update(r.params, r.optimizer, 0.1, 0.0, scale, r.found_inf);
  EXPECT_NEAR(norm.item<double>(), 13.0, 1e-5) << "the norm of the true gradients";
  EXPECT_TRUE(torch::equal(r.optimizer.grads[0], torch::tensor({3.0f, 4.0f})));
  EXPECT_TRUE(torch::equal(r.optimizer.grads[1], torch::tensor({12.0f})));
  EXPECT_EQ(r.optimizer.found_inf, 0.0);
}

TEST(ResidentUpdate, ANonFiniteGradientSetsTheSkipFlagWithOrWithoutAScale) {
  {
    Rig r;
    r.set_grads({1, kInf}, {2});
    resident_update(r.params, r.optimizer, 0.1, 1.0, torch::full({1}, 8.0f), r.found_inf);
    EXPECT_EQ(r.found_inf.item<float>(), 1.0f);
    EXPECT_EQ(r.optimizer.found_inf, 1.0) << "the optimizer is told to skip";
    EXPECT_EQ(r.optimizer.steps, 1) << "skipping is the optimizer's, without a host synchronisation here";
    EXPECT_EQ(r.optimizer.zeroed, 1);
  }
  {
    Rig r;  // fp32/bf16: no unscale, but a non-finite norm still skips
    r.set_grads({1, 2}, {std::nanf("")});
    const torch::Tensor norm = resident_update(r.params, r.optimizer, 0.1, 0.0, std::nullopt, r.found_inf);
    EXPECT_FALSE(std::isfinite(norm.item<double>()));
    EXPECT_EQ(r.found_inf.item<float>(), 1.0f);
    EXPECT_EQ(r.optimizer.found_inf, 1.0);
  }
}

TEST(ResidentUpdate, ParametersWithoutAGradientAreLeftOut) {
  Rig r;
  r.params[0].mutable_grad() = torch::tensor({6.0f, 8.0f});  // params[1] was not used this step
  const torch::Tensor norm = resident_update(r.params, r.optimizer, 0.1, 5.0, std::nullopt, r.found_inf);
  EXPECT_NEAR(norm.item<double>(), 10.0, 1e-5);
  EXPECT_TRUE(test::AllClose(r.optimizer.grads[0], torch::tensor({3.0, 4.0}), 1e-6, 0));
  EXPECT_FALSE(r.optimizer.grads[1].defined());

  Rig none;  // no gradient at all: a zero norm, still a step
  const torch::Tensor zero = resident_update(none.params, none.optimizer, 0.1, 1.0, std::nullopt, none.found_inf);
  EXPECT_EQ(zero.item<double>(), 0.0);
  EXPECT_EQ(none.found_inf.item<float>(), 0.0f);
  EXPECT_EQ(none.optimizer.steps, 1);
}

TEST(ResidentUpdate, TheGlobalNormHookReplacesTheLocalNormForClippingAndTheResult) {
  Rig r;
  r.set_grads({3, 4}, {0});
  double seen = -1;
  const auto global = [&](const torch::Tensor& local) {
    seen = local.item<double>();
    return torch::full({}, 10.0f);  // the other stages' share makes the whole 10
  };
  const torch::Tensor norm = resident_update(r.params, r.optimizer, 0.1, 5.0, std::nullopt, r.found_inf, global);
  EXPECT_NEAR(seen, 5.0, 1e-6) << "the hook gets this process's norm";
  EXPECT_EQ(norm.item<double>(), 10.0);
  EXPECT_TRUE(test::AllClose(r.optimizer.grads[0], torch::tensor({1.5, 2.0}), 1e-6, 0)) << "clipped by 5 / 10";
  const auto lost = [](const torch::Tensor&) { return torch::full({}, std::nanf("")); };
  Rig s;
  s.set_grads({3, 4}, {0});
  resident_update(s.params, s.optimizer, 0.1, 0.0, std::nullopt, s.found_inf, lost);
  EXPECT_EQ(s.found_inf.item<float>(), 1.0f) << "a stage's non-finite gradient skips every stage";
}

ScalerConfig scaler(int64_t growth_interval) {
  ScalerConfig sc;
  sc.growth_factor = 2.0;
  sc.backoff_factor = 0.5;
  sc.growth_interval = growth_interval;
  sc.min_scale = 1.0;
  return sc;
}

TEST(LossScale, AnOverflowHalvesTheScaleAndRestartsTheCount) {
  auto scale = torch::full({1}, 1024.0f);
  auto tracker = torch::full({1}, 1, torch::kInt32);
  update_loss_scale(scale, tracker, torch::ones({}), scaler(3));
  EXPECT_EQ(scale.item<float>(), 512.0f);
  EXPECT_EQ(tracker.item<int>(), 0);
}

TEST(LossScale, GrowthIntervalCleanStepsDoubleIt) {
  auto scale = torch::full({1}, 1024.0f);
  auto tracker = torch::zeros({1}, torch::kInt32);
  const auto clean = torch::zeros({});
  update_loss_scale(scale, tracker, clean, scaler(3));
  update_loss_scale(scale, tracker, clean, scaler(3));
  EXPECT_EQ(scale.item<float>(), 1024.0f) << "two clean steps of three";
  EXPECT_EQ(tracker.item<int>(), 2);
  update_loss_scale(scale, tracker, clean, scaler(3));
  EXPECT_EQ(scale.item<float>(), 2048.0f);
  EXPECT_EQ(tracker.item<int>(), 0);
}

TEST(LossScale, BackoffNeverGoesBelowTheFloor) {
  auto scale = torch::full({1}, 3.0f);
  auto tracker = torch::zeros({1}, torch::kInt32);
  ScalerConfig sc = scaler(100);
  sc.min_scale = 2.0;
  update_loss_scale(scale, tracker, torch::ones({}), sc);
  EXPECT_EQ(scale.item<float>(), 2.0f) << "1.5 clamped to min_scale";
  update_loss_scale(scale, tracker, torch::ones({}), sc);
  EXPECT_EQ(scale.item<float>(), 2.0f);
}

TEST(LossScale, AStaticScaleNeverMoves) {
  auto scale = torch::full({1}, 64.0f);
  auto tracker = torch::zeros({1}, torch::kInt32);
  ScalerConfig sc = scaler(1);
  sc.dynamic = false;
  update_loss_scale(scale, tracker, torch::ones({}), sc);
  update_loss_scale(scale, tracker, torch::zeros({}), sc);
  EXPECT_EQ(scale.item<float>(), 64.0f);
  EXPECT_EQ(tracker.item<int>(), 0);
}

}  // namespace
}  // namespace tandem
