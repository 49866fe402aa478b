// Training recipes (models/recipe.h): the table's bands, the published rate of every preset on each
// data kind, the warmup rule, and the built-in defaults as the generic row.

#include "tandem/models/recipe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <string>

#include "tandem/models/spec.h"

namespace tandem {
namespace {

// The bands tile the parameter axis: within each data kind the rows go up in size, each serves
// its own size, and a row's limit is about the geometric mean of its size and the next row's.
TEST(Recipe, RowsTileTheSizesAndServeTheirOwn) {
  for (const DataKind kind : {DataKind::kSynthetic, DataKind::kReal}) {
    const RecipeRow* prev = nullptr;
    for (const auto& r : recipe_rows()) {
      if (r.data != kind) continue;
      SCOPED_TRACE(r.name);
      EXPECT_GT(r.params, 0);
      EXPECT_LT(r.params, r.max_params);
      EXPECT_EQ(&recipe_row(r.params, kind), &r);
      EXPECT_STRNE(r.source, "");
      EXPECT_GT(r.published_warmup, 0);
      if (prev) {
        EXPECT_GT(r.params, prev->max_params);
        EXPECT_LE(r.lr, prev->lr) << "a larger model never takes a higher rate";
        const double geo = std::sqrt(double(prev->params) * double(r.params));
        EXPECT_NEAR(double(prev->max_params) / geo, 1.0, 0.02) << prev->name;
      }
      prev = &r;
    }
    ASSERT_NE(prev, nullptr);
  }
  // The last real-data row takes every size above the ones before.
  EXPECT_STREQ(recipe_row(int64_t{1} << 45, DataKind::kReal).name, "GPT-3 175B");
}

// The rates of the sources, preset by preset (Note [Training recipes]): GPT-3 Table 2.1 from 125M
// up, Pythia-70M below, and the default job's measured rate for small models on the generated corpus.
TEST(Recipe, EveryPresetGetsThePublishedRateOfItsSize) {
  struct Expected {
    const char* preset;
    double synthetic_lr, real_lr;
    const char* real_row;
  };
  const Expected kExpected[] = {
      {"tiny", 3e-3, 1e-3, "Pythia-70M"},
      {"125M", 6e-4, 6e-4, "GPT-3 Small"},
      {"1B", 2e-4, 2e-4, "GPT-3 XL"},
      {"3B", 1.6e-4, 1.6e-4, "GPT-3 2.7B"},
      {"7B", 1.2e-4, 1.2e-4, "GPT-3 6.7B"},
      {"13B", 1e-4, 1e-4, "GPT-3 13B"},
      {"bk-tiny", 3e-3, 1e-3, "Pythia-70M"},
      {"bk-125M", 6e-4, 6e-4, "GPT-3 Small"},
      {"mlp", 3e-3, 1e-3, "Pythia-70M"},
      {"amx-moe", 3e-4, 3e-4, "GPT-3 Medium"},
      {"amx-moe-tiny", 3e-3, 1e-3, "Pythia-70M"},
      {"qwen2.5-0.5B", 3e-4, 3e-4, "GPT-3 Medium"},
      {"qwen2.5-1.5B", 2e-4, 2e-4, "GPT-3 XL"},
      {"qwen2.5-7B", 1.2e-4, 1.2e-4, "GPT-3 6.7B"},
      {"mistral-7B", 1.2e-4, 1.2e-4, "GPT-3 6.7B"},
      {"gemma2-2B", 1.6e-4, 1.6e-4, "GPT-3 2.7B"},
  };
  ASSERT_EQ(std::size(kExpected), preset_names().size()) << "a new preset needs its expected recipe here";
  for (const auto& e : kExpected) {
    SCOPED_TRACE(e.preset);
    const int64_t n = preset_spec(e.preset).num_params_unpadded();
    EXPECT_DOUBLE_EQ(recipe_row(n, DataKind::kSynthetic).lr, e.synthetic_lr);
    EXPECT_DOUBLE_EQ(recipe_row(n, DataKind::kReal).lr, e.real_lr);
    EXPECT_STREQ(recipe_row(n, DataKind::kReal).name, e.real_row);
    Config c;
    c.model.preset = e.preset;
    c.data.path = "tokens.bin";
    EXPECT_EQ(&preset_recipe_row(c), &recipe_row(n, DataKind::kReal));
  }
}

// Every row uses the constants all three sources share.
TEST(Recipe, AdamWConstantsAreTheSourcesShared) {
  for (const auto& r : recipe_rows()) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(r.schedule, LrSchedule::kCosine);
    EXPECT_DOUBLE_EQ(r.min_lr_ratio, 0.1);
    EXPECT_DOUBLE_EQ(r.beta1, 0.9);
    EXPECT_DOUBLE_EQ(r.beta2, 0.95);
    EXPECT_DOUBLE_EQ(r.eps, 1e-8);
    EXPECT_DOUBLE_EQ(r.weight_decay, 0.1);
  }
}

// Note [Recipe warmup]: 10% of the run, at most the source's count.
TEST(Recipe, WarmupIsATenthOfTheRunUpToThePublishedCount) {
  const RecipeRow& small = recipe_row(125'000'000, DataKind::kReal);
  ASSERT_EQ(small.published_warmup, 750);
  EXPECT_EQ(recipe_warmup_steps(small, 400), 40);
  EXPECT_EQ(recipe_warmup_steps(small, 300), 30);
  EXPECT_EQ(recipe_warmup_steps(small, 7), 1);
  EXPECT_EQ(recipe_warmup_steps(small, 4), 0);
  EXPECT_EQ(recipe_warmup_steps(small, 0), 0);
  EXPECT_EQ(recipe_warmup_steps(small, 7499), 750);
  EXPECT_EQ(recipe_warmup_steps(small, 600'000), 750);
  const RecipeRow& job = recipe_row(820'352, DataKind::kSynthetic);
  EXPECT_EQ(recipe_warmup_steps(job, 300), 20) << "the default job warms up as it always did";
}

// The built-in defaults are the generic row at the default length, so a Config built by hand (the
// Python package's, for a module of unknown size) trains with a published recipe.
TEST(Recipe, BuiltInDefaultsAreTheGenericRow) {
  const Config defaults;
  OptimConfig generic = defaults.optim;
  apply_recipe(generic_recipe_row(), defaults.train.steps, generic);
  EXPECT_DOUBLE_EQ(defaults.optim.lr, generic.lr);
  EXPECT_DOUBLE_EQ(defaults.optim.lr, 3e-4);
  EXPECT_EQ(defaults.optim.warmup_steps, generic.warmup_steps);
  EXPECT_EQ(defaults.optim.schedule, generic.schedule);
  EXPECT_DOUBLE_EQ(defaults.optim.min_lr_ratio, generic.min_lr_ratio);
  EXPECT_DOUBLE_EQ(defaults.optim.beta1, generic.beta1);
  EXPECT_DOUBLE_EQ(defaults.optim.beta2, generic.beta2);
  EXPECT_DOUBLE_EQ(defaults.optim.eps, generic.eps);
  EXPECT_DOUBLE_EQ(defaults.optim.weight_decay, generic.weight_decay);
}

// apply_preset_recipe: what `tandem train` lays under a hand-built Config; none for sgd and lion.
TEST(Recipe, APresetRecipeIsLaidForAdamOnly) {
  Config c;
  c.train.steps = 300;
  apply_preset_recipe(c);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-3);  // tiny on the generated corpus: the default job
  EXPECT_EQ(c.optim.warmup_steps, 20);
  Config lion;
  lion.optim.type = OptimizerType::kLion;
  lion.model.preset = "125M";
  apply_preset_recipe(lion);
  EXPECT_DOUBLE_EQ(lion.optim.lr, Config{}.optim.lr);
  EXPECT_FALSE(recipe_applies(OptimizerType::kSgd));
  EXPECT_TRUE(recipe_applies(OptimizerType::kAdam));
}

}  // namespace
}  // namespace tandem
