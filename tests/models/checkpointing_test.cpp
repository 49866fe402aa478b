// Activation checkpointing of one Block (models/checkpointing.h): the forward keeps no graph and
// the Block runs again in backward, under the autocast state of the forward, giving the gradients
// an ordinary forward and backward give, accumulated into the parameters' .grad.

#include "tandem/models/checkpointing.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <vector>

#include "../test_util.h"
#include "tandem/models/autocast.h"
#include "tandem/models/block.h"

namespace tandem {
namespace {

// x + tanh(x W^T + b), counting its forward calls and what each call saw.
class ProbeBlock : public Block {
 public:
  explicit ProbeBlock(int64_t dim) : Block(BlockKind::kLayer, "layer.0", "model.layers.0.") {
    w = register_parameter("w", torch::randn({dim, dim}) * 0.4);
    b = register_parameter("b", torch::randn({dim}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    grad_mode.push_back(torch::GradMode::is_enabled());
    cpu_autocast.push_back(at::autocast::is_autocast_enabled(at::kCPU));
    inputs.push_back(x.detach().clone());
    return x + torch::tanh(torch::nn::functional::linear(x, w, b));
  }
  torch::Tensor w, b;
  std::vector<bool> grad_mode, cpu_autocast;
  std::vector<torch::Tensor> inputs;
};

constexpr double kF64Eps = std::numeric_limits<double>::epsilon();
constexpr double kF32Eps = std::numeric_limits<float>::epsilon();

TEST(Checkpointing, TheForwardKeepsNoGraphAndTheBlockRunsAgainInBackward) {
  torch::manual_seed(1);
  ProbeBlock block(7);
  const auto x = torch::randn({3, 5, 7}).requires_grad_(true);
  const auto y = checkpointed_forward(block, x);
  ASSERT_EQ(block.grad_mode.size(), 1u);
  EXPECT_FALSE(block.grad_mode[0]) << "the forward recorded the Block's activations";
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  ASSERT_EQ(block.grad_mode.size(), 2u) << "backward did not recompute the Block";
  EXPECT_TRUE(block.grad_mode[1]);
  EXPECT_TRUE(torch::equal(block.inputs[1], block.inputs[0])) << "the recompute saw another input";
}

TEST(Checkpointing, TheBlocksGradientsArriveWhenItsInputNeedsNone) {
  // A frozen embedding before the Block: its input needs no gradient, its parameters do.
  torch::manual_seed(4);
  ProbeBlock plain(6), ckpt(6);
  {
    torch::NoGradGuard no_grad;
    ckpt.w.copy_(plain.w);
    ckpt.b.copy_(plain.b);
  }
  const auto x = torch::randn({2, 3, 6});
  plain.forward(x).square().sum().backward();
  const auto y = checkpointed_forward(ckpt, x);
  ASSERT_TRUE(y.requires_grad()) << "backward would never reach the Block";
  y.square().sum().backward();
  ASSERT_TRUE(ckpt.w.grad().defined() && ckpt.b.grad().defined());
  EXPECT_TRUE(test::AllClose(ckpt.w.grad(), plain.w.grad(), 4 * kF32Eps, 0));
  EXPECT_TRUE(test::AllClose(ckpt.b.grad(), plain.b.grad(), 4 * kF32Eps, 0));
}

TEST(Checkpointing, EachParametersHooksRunOncePerBackward) {
  // The offload engine and the gradient reducer learn of a gradient from these hooks: the
  // parameters being inputs of the Function must not call them a second time.
  torch::manual_seed(6);
  ProbeBlock block(5);
  int pre = 0, post = 0;
  block.w.register_hook([&](const torch::Tensor&) { ++pre; });
  struct Count : torch::autograd::PostAccumulateGradHook {
    explicit Count(int& n) : n(n) {}
    void operator()(const torch::autograd::Variable&) override { ++n; }
    int& n;
  };
  torch::autograd::impl::set_post_acc_grad_hooks(block.w, std::make_unique<Count>(post));
  checkpointed_forward(block, torch::randn({2, 5}).requires_grad_(true)).sum().backward();
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 1);
  checkpointed_forward(block, torch::randn({2, 5})).sum().backward();
  EXPECT_EQ(pre, 2);
  EXPECT_EQ(post, 2);
}

TEST(Checkpointing, AFrozenBlockWithAFrozenInputKeepsNoGraph) {
  torch::manual_seed(5);
  ProbeBlock block(4);
  for (auto& p : block.parameters()) p.requires_grad_(false);
  const auto y = checkpointed_forward(block, torch::randn({2, 4}));
  EXPECT_FALSE(y.requires_grad());
}

TEST(Checkpointing, OutputAndGradientsEqualAPlainForwardAndBackward) {
  torch::manual_seed(2);
  ProbeBlock plain_a(17), plain_b(17);
  ProbeBlock ckpt_a(17), ckpt_b(17);
  {
    torch::NoGradGuard g;
    for (auto* p : {&plain_a, &plain_b, &ckpt_a, &ckpt_b}) p->to(torch::kFloat64);
    ckpt_a.w.copy_(plain_a.w), ckpt_a.b.copy_(plain_a.b);
    ckpt_b.w.copy_(plain_b.w), ckpt_b.b.copy_(plain_b.b);
  }
  const auto x0 = torch::randn({2, 9, 17}, torch::kFloat64);
  const auto weight = torch::randn({2, 9, 17}, torch::kFloat64);  // a fixed projection to a scalar
  auto x1 = x0.clone().requires_grad_(true), x2 = x0.clone().requires_grad_(true);
  // Two Blocks in a row: the second's input gradient is what the first one's backward receives.
  const auto y_plain = plain_b.forward(plain_a.forward(x1));
  const auto y_ckpt = checkpointed_forward(ckpt_b, checkpointed_forward(ckpt_a, x2));
  EXPECT_TRUE(test::AllClose(y_ckpt, y_plain, 0, 0)) << "the forward value changed";
  (y_plain * weight).sum().backward();
  (y_ckpt * weight).sum().backward();
  const double tol = 8 * kF64Eps;
  EXPECT_TRUE(test::AllClose(x2.grad(), x1.grad(), tol, tol)) << "input";
  EXPECT_TRUE(test::AllClose(ckpt_a.w.grad(), plain_a.w.grad(), tol, tol)) << "first Block's w";
  EXPECT_TRUE(test::AllClose(ckpt_a.b.grad(), plain_a.b.grad(), tol, tol)) << "first Block's b";
  EXPECT_TRUE(test::AllClose(ckpt_b.w.grad(), plain_b.w.grad(), tol, tol)) << "second Block's w";
  EXPECT_TRUE(test::AllClose(ckpt_b.b.grad(), plain_b.b.grad(), tol, tol)) << "second Block's b";
}

TEST(Checkpointing, ParameterGradientsAccumulateOverCalls) {
  torch::manual_seed(3);
  ProbeBlock block(7);
  block.to(torch::kFloat64);
  const auto x = torch::randn({4, 7}, torch::kFloat64).requires_grad_(true);
  checkpointed_forward(block, x).sum().backward();
  const auto once_w = block.w.grad().clone(), once_b = block.b.grad().clone();
  checkpointed_forward(block, x).sum().backward();
  const double tol = 4 * kF64Eps;
  EXPECT_TRUE(test::AllClose(block.w.grad(), 2 * once_w, tol, tol));
  EXPECT_TRUE(test::AllClose(block.b.grad(), 2 * once_b, tol, tol));
  EXPECT_FALSE(once_w.eq(0).all().item<bool>());
}

// Note [Checkpoint recompute]: backward runs outside the autocast region, yet the recompute must
// compute as the forward did (bf16 matmuls), and leave the caller's autocast state as it was.
TEST(Checkpointing, TheRecomputeRunsUnderTheForwardsAutocastState) {
  torch::manual_seed(4);
  ProbeBlock plain(17), ckpt(17);
  {
    torch::NoGradGuard g;
    ckpt.w.copy_(plain.w), ckpt.b.copy_(plain.b);
  }
  const auto x0 = torch::randn({3, 17});
  auto x1 = x0.clone().requires_grad_(true), x2 = x0.clone().requires_grad_(true);
  torch::Tensor y_plain, y_ckpt;
  {
    AutocastGuard cast(torch::kCPU, Precision::kBf16);
    y_plain = plain.forward(x1);
    y_ckpt = checkpointed_forward(ckpt, x2);
  }
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_TRUE(test::AllClose(y_ckpt, y_plain, 0, 0));
  y_plain.sum().backward();
  y_ckpt.sum().backward();
  ASSERT_EQ(ckpt.cpu_autocast.size(), 2u);
  EXPECT_TRUE(ckpt.cpu_autocast[0]);
  EXPECT_TRUE(ckpt.cpu_autocast[1]) << "the recompute ran without the forward's autocast";
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "backward left autocast switched on";
  // A recompute in fp32 would give gradients off by about bf16's epsilon (2^-8 relative).
  const double tol = 8 * kF32Eps;
  EXPECT_TRUE(test::AllClose(ckpt.w.grad(), plain.w.grad(), tol, tol));
  EXPECT_TRUE(test::AllClose(x2.grad(), x1.grad(), tol, tol));
}

TEST(Checkpointing, ABackwardInsideAnAutocastRegionRecomputesAsTheForwardRanWithout) {
  torch::manual_seed(5);
  ProbeBlock block(7);
  const auto x = torch::randn({2, 7}).requires_grad_(true);
  const auto y = checkpointed_forward(block, x);  // fp32
  {
    AutocastGuard cast(torch::kCPU, Precision::kBf16);
    y.sum().backward();
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU)) << "the caller's autocast state was not restored";
    EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCPU), at::kBFloat16);
  }
  ASSERT_EQ(block.cpu_autocast.size(), 2u);
  EXPECT_FALSE(block.cpu_autocast[1]);
  EXPECT_EQ(block.w.grad().scalar_type(), torch::kFloat32);
}

}  // namespace
}  // namespace tandem
