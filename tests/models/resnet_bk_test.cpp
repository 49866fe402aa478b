#include "tandem/models/resnet_bk.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "tandem/io/hf.h"
#include "tandem/models/model.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

TEST(ResNetBk, PresetParameterCountMatchesTheModules) {
  for (const char* name : {"bk-tiny", "bk-125M"}) {
    const ModelSpec spec = preset_spec(name);
    auto model = build_model(spec, false);
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    EXPECT_EQ(n, spec.num_params()) << name;
  }
  EXPECT_NEAR(double(preset_spec("bk-125M").num_params()), 125e6, 2e6);
}

TEST(ResNetBk, LogitsDependOnlyOnEarlierTokens) {
  torch::manual_seed(0);
  auto model = build_model(preset_spec("bk-tiny"), false);
  model->eval();
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 256, {2, 40}, torch::kInt64);
  const auto before = model->forward(tokens);
  auto changed = tokens.clone();
  changed.slice(1, 25).random_(0, 256);
  const auto after = model->forward(changed);
  EXPECT_TRUE(torch::allclose(after.slice(1, 0, 25), before.slice(1, 0, 25), 0, 0)) << "future tokens leaked";
  EXPECT_FALSE(torch::allclose(after.slice(1, 25), before.slice(1, 25)));
}

TEST(ResNetBk, TrainsResumesAndRoundTripsItsConfig) {
  test::TempDir d1, d2;
  Config c = test::tiny_cpu_config(d1.path(), 60);
  c.model.preset = "bk-tiny";
  const auto s = train(c, {});
  double tail = 0;
  for (size_t i = s.losses.size() - 5; i < s.losses.size(); ++i) tail += s.losses[i] / 5;
  EXPECT_LT(tail, 0.7 * s.losses.front()) << "first " << s.losses.front() << " last " << tail;
  // The run's model_config.json describes the same architecture.
  const ModelSpec back = spec_from_hf_config(d1.file("model_config.json"));
  EXPECT_EQ(back.arch, Arch::kResNetBk);
  EXPECT_EQ(back.num_params(), preset_spec("bk-tiny").num_params());
  // Resume continues with the identical losses of an uninterrupted run.
  Config r = test::tiny_cpu_config(d2.path(), 6);
  r.model.preset = "bk-tiny";
  const auto full = train(r, {});
  test::TempDir d3;
  r.train.run_dir = d3.path();
  r.train.steps = 3;
  train(r, {});
  r.train.steps = 6;
  const auto resumed = train(r, TrainOptions{d3.path()});
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], full.losses[3 + i]) << i;
}

}  // namespace
}  // namespace tandem
