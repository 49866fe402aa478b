#pragma once
// Training recipes: the peak learning rate, warmup, decay and AdamW constants a model of a given
// size trains with, each row from a published training run of that size (Note [Training recipes]).
// The recipe is a layer of the configuration: built-in defaults < recipe < config files < --set
// (Note [Config layers], io/config_layers.h).

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/config.h"

namespace tandem {

/// One row of the recipe table: what a published run near `params` parameters trained with.
struct RecipeRow {
  const char* name;  ///< the run it is from, e.g. "GPT-3 Small"
  /// kReal rows serve every data kind; a kSynthetic row serves only the generated corpus, where
  /// it takes precedence over the real-data row of the same size.
  DataKind data;
  int64_t params;      ///< the size of the source's model (0: the generic row)
  int64_t max_params;  ///< the row serves models below this many parameters (and above the row before)
  double lr;           ///< peak learning rate
  /// Warmup steps of the source's run: the most recipe_warmup_steps gives (Note [Recipe warmup]).
  int64_t published_warmup;
  LrSchedule schedule;
  double min_lr_ratio;  ///< decay floor as a fraction of lr
  double beta1, beta2, eps, weight_decay;
  const char* source;  ///< paper and table, or the measurement
};

/// Every row of the table: the generated corpus's, then real data's, each smallest model first.
const std::vector<RecipeRow>& recipe_rows();

/// The row for a model of `params` parameters (as an HF checkpoint counts them) trained on `data`.
const RecipeRow& recipe_row(int64_t params, DataKind data);

/// The row for a model of unknown size: the built-in defaults of OptimConfig are its values at the
/// default train.steps (a test holds them together).
const RecipeRow& generic_recipe_row();

/// Note [Recipe warmup]: the warmup of a run of `train_steps` steps under `row`.
int64_t recipe_warmup_steps(const RecipeRow& row, int64_t train_steps);

/// The keys a recipe sets (optim.lr, optim.warmup_steps, ...), in the order `tandem inspect` shows them.
const std::vector<std::string>& recipe_keys();

/// Writes the row's values into `o`, the warmup for a run of `train_steps` steps.
void apply_recipe(const RecipeRow& row, int64_t train_steps, OptimConfig& o);

/// Whether the recipe applies to optim.type: the rows are AdamW runs, so adamw and adam take them;
/// sgd and lion keep the built-in defaults (their rates differ from Adam's by large factors).
bool recipe_applies(OptimizerType type);

/// The row of cfg's own model (model.preset with its overrides) and data. model.init_from's size is
/// read by io/config_layers.h, which knows HF directories.
const RecipeRow& preset_recipe_row(const Config& cfg);

/// Lays the recipe of cfg's model and data over cfg.optim, as `tandem train` would with no optim
/// keys given: for C++ callers that build a Config by hand (api/hybrid.h, tests).
void apply_preset_recipe(Config& cfg);

}  // namespace tandem
