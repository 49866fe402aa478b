// Tensor-core shapes: the presets are aligned, misaligned dimensions are named, and feed-forward
// padding never changes the model.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "tandem/io/hf.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

TEST(Shapes, EveryPresetIsTensorCoreAligned) {
  for (const auto& name : preset_names()) {
    const ModelSpec s = preset_spec(name);
    EXPECT_TRUE(misaligned_dims(s, 8).empty()) << name;
    const auto bad16 = misaligned_dims(s, 16);
    if (s.arch != Arch::kResNetBk && s.arch != Arch::kAmxMoe) {
      EXPECT_TRUE(bad16.empty()) << name;
      continue;
    }
    // MoE presets: only the small matrices whose size is a count of experts or BK heads (router,
    // BK input projection) may miss fp8's 16, and inspect names them.
    for (const auto& m : bad16)
      EXPECT_TRUE(m.rfind("mlp.router", 0) == 0 || m.rfind("bk.in_proj", 0) == 0) << name << ": " << m;
  }
}

TEST(Shapes, MisalignedDimensionsAreNamed) {
  ModelConfig c;
  c.d_model = 120, c.n_head = 4, c.n_kv_head = 4, c.d_ff = 300;
  const auto bad = misaligned_dims(resolve_model_spec(c), 16);
  ASSERT_FALSE(bad.empty());
  EXPECT_NE(bad.front().find("120"), std::string::npos);
  EXPECT_EQ(resolve_model_spec(c).padded_d_ff(), 320);
}

// d_ff = 300 is stored as 320: the 20 extra units start at zero, stay exactly zero through
// training, and leave the HF export (and a model loaded from it) unchanged.
TEST(Shapes, FeedForwardPaddingStaysZeroAndLeavesTheExport) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 15);
  c.model.d_ff = 300;
  c.train.save_final = true;
  train(c, {});
  const ModelSpec spec = resolve_model_spec(c.model);
  auto model = build_model(spec, false);
  // Load the run's final HF checkpoint into a fresh model and inspect the padding.
  const auto ckpt = dir.path() + "/checkpoints/step_00000015";
  const auto export_of = [&](Model& m) {
    std::map<std::string, torch::Tensor> out;
    for (auto& [n, t] : m.hf_state_dict()) out[n] = t.clone();
    return out;
  };
  load_hf_weights(*model, ckpt);
  for (auto& [name, p] : model->hf_parameters()) {
    if (name.find("gate_proj") != std::string::npos || name.find("up_proj") != std::string::npos) {
      EXPECT_EQ(p.size(0), 320);
      EXPECT_TRUE(p.narrow(0, 300, 20).eq(0).all().item<bool>()) << name;
    }
    if (name.find("down_proj") != std::string::npos) {
      EXPECT_EQ(p.size(1), 320);
      EXPECT_TRUE(p.narrow(1, 300, 20).eq(0).all().item<bool>()) << name;
    }
  }
  const auto hf = export_of(*model);
  EXPECT_EQ(hf.at("model.layers.0.mlp.gate_proj.weight").size(0), 300);
  EXPECT_EQ(hf.at("model.layers.0.mlp.down_proj.weight").size(1), 300);
  // An unpadded computation of the feed-forward equals the padded one.
  torch::NoGradGuard no_grad;
  auto x = torch::randn({3, 128});
  const auto& g = hf.at("model.layers.0.mlp.gate_proj.weight");
  const auto& u = hf.at("model.layers.0.mlp.up_proj.weight");
  const auto& d = hf.at("model.layers.0.mlp.down_proj.weight");
  const auto unpadded = torch::matmul(torch::silu(x.matmul(g.t())) * x.matmul(u.t()), d.t());
  torch::Tensor gp, up, dp;
  for (auto& [name, p] : model->hf_parameters()) {
    if (name == "model.layers.0.mlp.gate_proj.weight") gp = p;
    if (name == "model.layers.0.mlp.up_proj.weight") up = p;
    if (name == "model.layers.0.mlp.down_proj.weight") dp = p;
  }
  const auto padded = torch::matmul(torch::silu(x.matmul(gp.t())) * x.matmul(up.t()), dp.t());
  EXPECT_TRUE(test::AllClose(padded, unpadded, 1e-6, 1e-6));
}

}  // namespace
}  // namespace tandem
