// The configuration from its layers (io/config_layers.h, Note [Config layers]): the recipe under
// every source, a key a source sets winning over it (YAML, DeepSpeed JSON, --set, the Python dict),
// each key's origin, and the recipe chosen for a preset, an HF directory, a module and no model.

#include "tandem/io/config_layers.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "tandem/io/hf.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

using Keys = std::vector<std::pair<std::string, std::string>>;

/// The 125M preset on a token file for 400 steps: GPT-3 Small's row, warmup 40.
ConfigLayer real_125m() {
  return key_layer("flags", {{"model.preset", "125M"}, {"data.path", "tokens.bin"}, {"train.steps", "400"}});
}

std::string origin_of(const ResolvedConfig& r, const std::string& key) {
  for (const auto& o : r.origins)
    if (o.key == key) return o.origin;
  return "(no origin for " + key + ")";
}

TEST(ConfigLayers, TheRecipeFillsWhatNoSourceSets) {
  const ResolvedConfig r = resolve_config({real_125m()});
  ASSERT_NE(r.recipe, nullptr);
  EXPECT_STREQ(r.recipe->name, "GPT-3 Small");
  EXPECT_EQ(r.model, "preset 125M");
  EXPECT_EQ(r.model_params, preset_spec("125M").num_params_unpadded());
  EXPECT_EQ(r.data, DataKind::kReal);
  EXPECT_DOUBLE_EQ(r.config.optim.lr, 6e-4);
  EXPECT_EQ(r.config.optim.warmup_steps, 40);
  EXPECT_EQ(r.config.optim.schedule, LrSchedule::kCosine);
  EXPECT_DOUBLE_EQ(r.config.optim.min_lr_ratio, 0.1);
  ASSERT_EQ(r.origins.size(), recipe_keys().size());
  for (const auto& o : r.origins) EXPECT_EQ(o.origin, "recipe") << o.key;
  // The default job: tiny on the generated corpus, 300 steps, as it always ran.
  const ResolvedConfig job = resolve_config({});
  EXPECT_DOUBLE_EQ(job.config.optim.lr, 3e-3);
  EXPECT_EQ(job.config.optim.warmup_steps, 20);
  EXPECT_EQ(job.data, DataKind::kSynthetic);
}

TEST(ConfigLayers, SetWinsOverTheRecipeAndEarlierLayers) {
  test::TempDir dir;
  std::ofstream(dir.file("run.yaml")) << "optim:\n  lr: 2e-4\n  warmup_steps: 5\n";
  const ResolvedConfig r = resolve_config(
      {real_125m(), config_file_layer(dir.file("run.yaml")), key_layer("--set", {{"optim.lr", "1e-3"}})});
  EXPECT_DOUBLE_EQ(r.config.optim.lr, 1e-3);
  EXPECT_EQ(origin_of(r, "optim.lr"), "--set");
  EXPECT_EQ(r.config.optim.warmup_steps, 5);
  EXPECT_EQ(origin_of(r, "optim.warmup_steps"), dir.file("run.yaml"));
  EXPECT_EQ(origin_of(r, "optim.beta2"), "recipe");
}

TEST(ConfigLayers, YamlWinsOverTheRecipe) {
  test::TempDir dir;
  std::ofstream(dir.file("run.yaml")) << "optim:\n  lr: 2e-4\n  weight_decay: 0.01\n  schedule: linear\n";
  const ResolvedConfig r = resolve_config({real_125m(), config_file_layer(dir.file("run.yaml"))});
  EXPECT_DOUBLE_EQ(r.config.optim.lr, 2e-4);
  EXPECT_DOUBLE_EQ(r.config.optim.weight_decay, 0.01);
  EXPECT_EQ(r.config.optim.schedule, LrSchedule::kLinear);
  for (const char* k : {"optim.lr", "optim.weight_decay", "optim.schedule"})
    EXPECT_EQ(origin_of(r, k), dir.file("run.yaml")) << k;
  EXPECT_EQ(r.config.optim.warmup_steps, 40);
  EXPECT_EQ(origin_of(r, "optim.warmup_steps"), "recipe");
}

TEST(ConfigLayers, DeepSpeedJsonWinsOverTheRecipe) {
  test::TempDir dir;
  std::ofstream(dir.file("ds.json"))
      << R"({"optimizer": {"type": "AdamW", "params": {"lr": 5e-5, "betas": [0.9, 0.99]}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 7}}})";
  const ResolvedConfig r = resolve_config({real_125m(), config_file_layer(dir.file("ds.json"))});
  EXPECT_DOUBLE_EQ(r.config.optim.lr, 5e-5);
  EXPECT_DOUBLE_EQ(r.config.optim.beta2, 0.99);
  EXPECT_EQ(r.config.optim.warmup_steps, 7);
  for (const char* k : {"optim.lr", "optim.beta2", "optim.warmup_steps"})
    EXPECT_EQ(origin_of(r, k), dir.file("ds.json")) << k;
  EXPECT_EQ(origin_of(r, "optim.beta1"), "recipe");  // 0.9 in the file too: the same value
  // --deepspeed reads the same file whatever its name; a ratio in it is of the recipe's peak.
  std::ofstream(dir.file("ds.conf"))
      << R"({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_min_ratio": 0.5}}})";
  const ResolvedConfig s = resolve_config({real_125m(), deepspeed_layer(dir.file("ds.conf"))});
  EXPECT_DOUBLE_EQ(s.config.optim.lr, 6e-4);
  EXPECT_DOUBLE_EQ(s.config.optim.warmup_min_lr, 3e-4);
}

// A value equal to the recipe's changes nothing in the second pass, one equal to the built-in
// default nothing in the first: either way the origin is the layer that gave it.
TEST(ConfigLayers, AUserValueEqualToTheRecipeOrTheDefaultIsStillTheUsers) {
  const ResolvedConfig same = resolve_config({real_125m(), key_layer("--set", {{"optim.lr", "6e-4"}})});
  EXPECT_EQ(origin_of(same, "optim.lr"), "--set");
  const ResolvedConfig dflt = resolve_config({real_125m(), key_layer("--set", {{"optim.lr", "3e-4"}})});
  EXPECT_DOUBLE_EQ(dflt.config.optim.lr, 3e-4);
  EXPECT_EQ(origin_of(dflt, "optim.lr"), "--set");
}

// The Python package's dict is a key layer like --set; its module's size picks the row, and its
// batches count as real data.
TEST(ConfigLayers, AModuleGetsTheRowOfItsSize) {
  RecipeOptions o;
  o.model = RecipeModel::kModule;
  o.module_params = 1'300'000'000;
  const ResolvedConfig r = resolve_config({key_layer("tandem.Engine(config=...)", {{"train.steps", "1000"}})}, o);
  ASSERT_NE(r.recipe, nullptr);
  EXPECT_STREQ(r.recipe->name, "GPT-3 XL");
  EXPECT_EQ(r.data, DataKind::kReal);
  EXPECT_DOUBLE_EQ(r.config.optim.lr, 2e-4);
  EXPECT_EQ(r.config.optim.warmup_steps, 100);
  const ResolvedConfig mine = resolve_config({key_layer("tandem.Engine(config=...)", {{"optim.lr", "1e-5"}})}, o);
  EXPECT_DOUBLE_EQ(mine.config.optim.lr, 1e-5);
  EXPECT_EQ(origin_of(mine, "optim.lr"), "tandem.Engine(config=...)");
  RecipeOptions unknown;
  unknown.model = RecipeModel::kUnknown;
  const ResolvedConfig g = resolve_config({}, unknown);
  EXPECT_EQ(g.recipe, &generic_recipe_row());
  EXPECT_DOUBLE_EQ(g.config.optim.lr, Config{}.optim.lr);
  EXPECT_EQ(g.config.optim.warmup_steps, Config{}.optim.warmup_steps);
}

TEST(ConfigLayers, AnHfDirectoryGetsTheRowOfItsSize) {
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << hf_config_json(preset_spec("1B"));
  const ResolvedConfig r =
      resolve_config({key_layer("flags", {{"model.init_from", dir.path()}, {"data.path", "tokens.bin"}})});
  ASSERT_NE(r.recipe, nullptr);
  EXPECT_STREQ(r.recipe->name, "GPT-3 XL");
  EXPECT_EQ(r.model, "model.init_from " + dir.path());
  EXPECT_DOUBLE_EQ(r.config.optim.lr, 2e-4);
  // Resumed, the checkpoint's config.json describes the model (the directory may be gone).
  test::TempDir ckpt;
  std::ofstream(ckpt.file("config.json")) << hf_config_json(preset_spec("125M"));
  RecipeOptions o;
  o.resume_dir = ckpt.path();
  const ResolvedConfig resumed = resolve_config({key_layer("flags", {{"model.init_from", dir.file("gone")}})}, o);
  EXPECT_STREQ(resumed.recipe->name, "GPT-3 Small");
}

TEST(ConfigLayers, SgdAndLionKeepTheBuiltInDefaults) {
  const ResolvedConfig r = resolve_config({real_125m(), key_layer("--set", {{"optim.type", "lion"}})});
  EXPECT_EQ(r.recipe, nullptr);
  EXPECT_DOUBLE_EQ(r.config.optim.lr, Config{}.optim.lr);
  EXPECT_EQ(origin_of(r, "optim.lr"), "built-in default");
  EXPECT_NE(format_recipe(r).find("none for optim.type=lion"), std::string::npos) << format_recipe(r);
}

TEST(ConfigLayers, ErrorsOfALayerAndOfTheValidationReachTheCaller) {
  EXPECT_NE(test::error_of([] {
              resolve_config({key_layer("--set", {{"optim.lrr", "1"}})});
            }).find("optim.lr"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              resolve_config({key_layer("--set", {{"optim.lr", "-1"}})});
            }).find("optim.lr must be > 0"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { config_file_layer("run.toml"); }).find("unknown extension"), std::string::npos);
}

}  // namespace
}  // namespace tandem
