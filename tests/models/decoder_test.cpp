#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "../test_util.h"
#include "tandem/models/decoder.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

ModelSpec small_spec() {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 32, s.n_head = 4, s.n_kv_head = 2, s.d_ff = 48, s.vocab_size = 50, s.max_seq_len = 16;
  return s;
}

TEST(Decoder, HfParameterNames) {
  ModelSpec s = small_spec();
  s.tie_embeddings = false;
  Model m(s, false);
  std::set<std::string> names;
  for (auto& [n, p] : m.hf_parameters()) names.insert(n);
  for (const char* n :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight", "model.norm.weight", "lm_head.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_EQ(names.size(), 2u + 9u * 2 + 1u);
  auto state = m.hf_state_dict();
  for (auto& [n, t] : state) {
    if (n == "lm_head.weight" || n == "model.embed_tokens.weight") {
      EXPECT_EQ(t.size(0), 50) << n;
    }
  }
  s.tie_embeddings = true;
  Model tied(s, false);
  for (auto& [n, p] : tied.hf_parameters()) EXPECT_NE(n, "lm_head.weight");
}

TEST(Decoder, RopeMatchesRotationDefinition) {
  // Position p rotates pair (i, i + hd/2) by angle p * theta^(-2i/hd).
  ModelSpec s = small_spec();
  RopeTable rope(s);
  auto [cos, sin] = rope.get(5, torch::kCPU, torch::kFloat64);
  auto x = torch::randn({1, 1, 5, 8}, torch::kFloat64);
  auto y = apply_rope(x, cos, sin);
  const int64_t p = 3, i = 1, hd = 8;
  const double angle = p * std::pow(s.rope_theta, -2.0 * i / hd);
  const double a = x[0][0][p][i].item<double>(), b = x[0][0][p][i + hd / 2].item<double>();
  EXPECT_NEAR(y[0][0][p][i].item<double>(), a * std::cos(angle) - b * std::sin(angle), 1e-6);
  EXPECT_NEAR(y[0][0][p][i + hd / 2].item<double>(), b * std::cos(angle) + a * std::sin(angle), 1e-6);
}

TEST(Decoder, CausalityFutureTokensDoNotChangePast) {
  torch::manual_seed(1);
  Model m(small_spec(), false);
  auto t = torch::randint(0, 50, {1, 8}, torch::kInt64);
  auto t2 = t.clone();
  t2[0][6] = (t[0][6].item<int64_t>() + 1) % 50;
  auto a = m.forward(t), b = m.forward(t2);
  EXPECT_TRUE(test::AllClose(a.narrow(1, 0, 6), b.narrow(1, 0, 6), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 6, 1), b.narrow(1, 6, 1)));
}

TEST(Decoder, FiniteDifferenceGradientOfOneBlockInDouble) {
  torch::manual_seed(2);
  ModelSpec s = small_spec();
  s.d_model = 16, s.n_head = 4, s.n_kv_head = 2, s.d_ff = 24;
  auto rope = std::make_shared<RopeTable>(s);
  DecoderLayer layer(s, 0, rope);
  layer.to(torch::kFloat64);
  auto x = torch::randn({2, 5, 16}, torch::kFloat64).requires_grad_(true);
  auto w = torch::randn({2, 5, 16}, torch::kFloat64);  // fixed projection to a scalar
  const auto f = [&]() { return (layer.forward(x) * w).sum(); };
  f().backward();
  std::vector<std::pair<std::string, torch::Tensor>> checks{{"input", x}};
  for (auto& item : layer.named_parameters()) checks.emplace_back(item.key(), item.value());
  const double h = 1e-6;
  for (auto& [name, t] : checks) {
    auto grad = t.grad().clone();
    auto flat = t.detach().view(-1);
    // Several entries of each tensor, spread over it.
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t idx = (k * 7919) % flat.numel();
      const double orig = flat[idx].item<double>();
      torch::NoGradGuard g;
      flat[idx] = orig + h;
      const double up = f().item<double>();
      flat[idx] = orig - h;
      const double down = f().item<double>();
      flat[idx] = orig;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grad.view(-1)[idx].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::abs(numeric)) << name << "[" << idx << "]";
    }
  }
}

TEST(Mlp, PresetTrainsForwardAndBackward) {
  torch::manual_seed(4);
  Model m(preset_spec("mlp"), true);
  auto tokens = torch::randint(0, 256, {2, 16}, torch::kInt64);
  auto loss = m.loss(m.forward(tokens), tokens);
  loss.backward();
  for (auto& [n, p] : m.hf_parameters()) EXPECT_TRUE(p.grad().defined()) << n;
}

}  // namespace
}  // namespace tandem
