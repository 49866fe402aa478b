// The `mlp` preset's layer (models/mlp_layer.h): x + down(gelu(up(rmsnorm(x)))) against a
// double-precision reference on the unpadded weights, its HF names and shapes, the initial scales,
// and feed-forward padding that starts at zero and receives no gradient.

#include "tandem/models/mlp_layer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>

#include "../test_util.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

// d_ff 50 is stored as 64: 14 padding units.
ModelSpec small_mlp(int64_t n_layer = 3) {
  ModelSpec s = preset_spec("mlp");
  s.d_model = 24, s.d_ff = 50, s.n_layer = n_layer;
  return s;
}

std::map<std::string, torch::Tensor> by_name(MlpLayer& layer) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [n, p] : layer.hf_parameters()) out[n] = p;
  return out;
}

constexpr double kF32Tol = 32 * std::numeric_limits<float>::epsilon();

TEST(MlpLayer, NamesShapesAndHfShapesOfItsParameters) {
  const ModelSpec s = small_mlp();
  ASSERT_EQ(s.padded_d_ff(), 64);
  MlpLayer layer(s, 2);
  EXPECT_EQ(layer.name(), "layer.2");
  EXPECT_EQ(layer.kind(), BlockKind::kLayer);
  auto p = by_name(layer);
  ASSERT_EQ(p.size(), 3u);
  const std::string pre = "model.layers.2.";
  ASSERT_TRUE(p.count(pre + "input_layernorm.weight") && p.count(pre + "mlp.up_proj.weight") &&
              p.count(pre + "mlp.down_proj.weight"));
  const auto& up = p.at(pre + "mlp.up_proj.weight");
  const auto& down = p.at(pre + "mlp.down_proj.weight");
  const auto& norm = p.at(pre + "input_layernorm.weight");
  EXPECT_EQ(up.sizes().vec(), (std::vector<int64_t>{64, 24}));
  EXPECT_EQ(down.sizes().vec(), (std::vector<int64_t>{24, 64}));
  EXPECT_EQ(layer.hf_shape(pre + "mlp.up_proj.weight", up), (std::vector<int64_t>{50, 24}));
  EXPECT_EQ(layer.hf_shape(pre + "mlp.down_proj.weight", down), (std::vector<int64_t>{24, 50}));
  EXPECT_EQ(layer.hf_shape(pre + "input_layernorm.weight", norm), (std::vector<int64_t>{24}));
  EXPECT_TRUE(torch::equal(norm, torch::ones({24})));
  // A tensor of the same shape that is not the layer's own keeps its shape.
  EXPECT_EQ(layer.hf_shape("other", torch::zeros({64, 24})), (std::vector<int64_t>{64, 24}));
}

TEST(MlpLayer, PaddingStartsAtZeroAndTheScalesFollowTheDepth) {
  ModelSpec s = small_mlp(8);
  s.d_model = 512, s.d_ff = 1000;  // stored as 1024; enough entries to measure the scales
  torch::manual_seed(1);
  MlpLayer layer(s, 0);
  auto p = by_name(layer);
  const auto up = p.at("model.layers.0.mlp.up_proj.weight").to(torch::kFloat64);
  const auto down = p.at("model.layers.0.mlp.down_proj.weight").to(torch::kFloat64);
  EXPECT_TRUE(up.narrow(0, 1000, 24).eq(0).all().item<bool>());
  EXPECT_TRUE(down.narrow(1, 1000, 24).eq(0).all().item<bool>());
  // up: N(0, 0.02^2); down: N(0, (0.02 / sqrt(2 n_layer))^2) = 0.005 at 8 layers. Standard error
  // of a std from 512000 samples: std / 1012.
  const double up_sd = up.narrow(0, 0, 1000).std().item<double>();
  const double down_sd = down.narrow(1, 0, 1000).std().item<double>();
  EXPECT_NEAR(up_sd, 0.02, 5 * 0.02 / 1012);
  EXPECT_NEAR(down_sd, 0.005, 5 * 0.005 / 1012);
}

TEST(MlpLayer, ForwardIsTheResidualMlpOfTheUnpaddedWeights) {
  ModelSpec s = small_mlp();
  s.norm_eps = 0.25;  // large enough that a misplaced eps shows
  torch::manual_seed(2);
  MlpLayer layer(s, 0);
  auto p = by_name(layer);
  {
    torch::NoGradGuard g;
    p.at("model.layers.0.input_layernorm.weight").copy_(torch::randn({24}));
    p.at("model.layers.0.mlp.up_proj.weight").narrow(0, 0, 50).mul_(20);  // pre-activations of order 1
    p.at("model.layers.0.mlp.down_proj.weight").narrow(1, 0, 50).mul_(20);
  }
  for (const int64_t T : {1, 7, 17}) {
    const auto x = torch::randn({2, T, 24});
    const auto y = layer.forward(x);
    ASSERT_EQ(y.sizes(), x.sizes());
    const auto xd = x.to(torch::kFloat64);
    const auto w = p.at("model.layers.0.input_layernorm.weight").to(torch::kFloat64);
    const auto up = p.at("model.layers.0.mlp.up_proj.weight").narrow(0, 0, 50).to(torch::kFloat64);
    const auto down = p.at("model.layers.0.mlp.down_proj.weight").narrow(1, 0, 50).to(torch::kFloat64);
    const auto h = xd / torch::sqrt(xd.pow(2).mean(-1, true) + 0.25) * w;
    const auto u = torch::matmul(h, up.t());
    const auto act = 0.5 * u * (1 + torch::erf(u / std::sqrt(2.0)));  // exact GELU
    const auto ref = xd + torch::matmul(act, down.t());
    EXPECT_TRUE(test::AllClose(y, ref, kF32Tol, kF32Tol)) << "T=" << T;
  }
}

TEST(MlpLayer, PaddingUnitsGetNoGradientAndSoStayZero) {
  const ModelSpec s = small_mlp();
  torch::manual_seed(3);
  MlpLayer layer(s, 1);
  auto p = by_name(layer);
  const auto x = torch::randn({3, 5, 24});
  (layer.forward(x) * torch::randn({3, 5, 24})).sum().backward();
  const auto& up = p.at("model.layers.1.mlp.up_proj.weight");
  const auto& down = p.at("model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(up.grad().defined() && down.grad().defined());
  EXPECT_TRUE(up.grad().narrow(0, 50, 14).eq(0).all().item<bool>());
  EXPECT_TRUE(down.grad().narrow(1, 50, 14).eq(0).all().item<bool>());
  EXPECT_FALSE(up.grad().narrow(0, 0, 50).eq(0).all().item<bool>()) << "the real units got no gradient either";
  EXPECT_FALSE(down.grad().narrow(1, 0, 50).eq(0).all().item<bool>());
}

}  // namespace
}  // namespace tandem
