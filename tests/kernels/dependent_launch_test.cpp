// Dependent launches (Note [Dependent launch]): a chain of decode kernels, each reading the one
// before it, gives the ordinary launches' bits, eager and recorded; and the switch.

#include "tandem/kernels/dependent_launch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "tandem/core/device_graph.h"
#include "tandem/kernels/decode_fusions.h"
#include "tandem/kernels/skinny_linear.h"

namespace tandem {
namespace {

// Restores the switch as it was.
class DependentLaunchSwitch {
 public:
  explicit DependentLaunchSwitch(bool allowed) : was_(detail::dependent_launch_allowed()) {
    detail::allow_dependent_launch(allowed);
  }
  ~DependentLaunchSwitch() { detail::allow_dependent_launch(was_); }
  DependentLaunchSwitch(const DependentLaunchSwitch&) = delete;
  DependentLaunchSwitch& operator=(const DependentLaunchSwitch&) = delete;

 private:
  bool was_;
};

TEST(DependentLaunch, TheSwitchCanBeTurnedOffAndOn) {
  {
    const DependentLaunchSwitch off(false);
    EXPECT_FALSE(detail::dependent_launch_allowed());
  }
  {
    const DependentLaunchSwitch on(true);
    EXPECT_TRUE(detail::dependent_launch_allowed());
  }
}

// Layers of a decode step at batch 1 in bf16, each kernel reading what the one before it wrote:
// two products back to back (the second waits for the first's every output), the gated activation,
// a product again, and the residual add with the norm that feeds the next layer. Returns the last
// residual, fp32.
torch::Tensor run_chain(const std::vector<torch::Tensor>& weights, const torch::Tensor& norm_w, torch::Tensor x) {
  auto normed = x.to(torch::kBFloat16);
  for (size_t i = 0; i + 2 < weights.size(); i += 3) {
    const auto h = skinny_linear(normed, weights[i], {});               // (1, C) -> (1, C)
    const auto gu = skinny_linear(h, weights[i + 1], {});               // (1, C) -> (1, 2F)
    const auto down = skinny_linear(silu_mul(gu), weights[i + 2], {});  // (1, F) -> (1, C)
    std::tie(x, normed) = add_rms_norm_cast(x, down, norm_w, 1e-5, false, torch::kBFloat16);
  }
  return x;
}

// Equal bit for bit (NaN included), fp32.
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::equal(a.view(torch::kInt32), b.view(torch::kInt32));
}

TEST(DependentLaunchGpu, AChainOfDecodeKernelsGivesTheOrdinaryLaunchesBits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(11);
  const int64_t C = 2048, F = 5632, layers = 24;
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(cuda);
  std::vector<torch::Tensor> weights;
  for (int64_t l = 0; l < layers; ++l) {
    weights.push_back(torch::randn({C, C}, bf16) / std::sqrt(double(C)));
    weights.push_back(torch::randn({2 * F, C}, bf16) / std::sqrt(double(C)));
    weights.push_back(torch::randn({C, F}, bf16) / std::sqrt(double(F)));
  }
  const auto norm_w = torch::rand({C}, cuda) + 0.5;
  const auto x0 = torch::randn({1, C}, cuda);

  torch::Tensor ordinary;
  {
    const DependentLaunchSwitch off(false);
    ordinary = run_chain(weights, norm_w, x0).cpu();
  }
  ASSERT_TRUE(torch::isfinite(ordinary).all().item<bool>());
  const DependentLaunchSwitch on(true);
  for (int repeat = 0; repeat < 3; ++repeat) {
    const auto eager = run_chain(weights, norm_w, x0).cpu();
    EXPECT_TRUE(same_bits(eager, ordinary)) << "repeat " << repeat << ": eager dependent launches differ by up to "
                                            << (eager - ordinary).abs().max().item<float>();
  }
  GraphRecorder* recorder = graph_recorder();
  ASSERT_NE(recorder, nullptr);
  auto input = x0.clone();
  torch::Tensor output;
  const auto graph = recorder->record(0, [&] { output = run_chain(weights, norm_w, input); });
  for (int replay = 0; replay < 3; ++replay) {
    graph->replay();
    const auto recorded = output.cpu();
    EXPECT_TRUE(same_bits(recorded, ordinary))
        << "replay " << replay << ": recorded dependent launches differ by up to "
        << (recorded - ordinary).abs().max().item<float>();
  }
}

}  // namespace
}  // namespace tandem
