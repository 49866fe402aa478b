#pragma once
// The configuration from its layers (Note [Config layers]): the built-in defaults, then the training
// recipe of the model's size and the data (models/recipe.h), then each source the user gave, in
// order. A key a source sets always wins over the recipe.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/models/recipe.h"

namespace tandem {

/// One source of configuration values, applied over the ones below it.
struct ConfigLayer {
  std::string name;  ///< where its values come from, as `tandem inspect` names it: a path, "--set", ...
  /// Writes the layer's keys into cfg; appends what the user should be told (ignored keys) to warnings.
  std::function<void(Config& cfg, std::vector<std::string>& warnings)> apply;
};

/// A config file by its extension: .yaml/.yml tandem's keys, .json a DeepSpeed config.
ConfigLayer config_file_layer(const std::string& path);
/// A DeepSpeed JSON config whatever its extension (--deepspeed).
ConfigLayer deepspeed_layer(const std::string& path);
/// The configuration a checkpoint was written with (a resumed run).
ConfigLayer checkpoint_layer(const std::string& checkpoint_dir);
/// Keys and their values as text (the Python package's config dict); each error names `name`.
ConfigLayer key_layer(const std::string& name, std::vector<std::pair<std::string, std::string>> keys);

/// Which model the recipe is chosen for.
enum class RecipeModel {
  kConfig,   ///< the config's own: model.init_from's config.json, else model.preset with its overrides
  kModule,   ///< a model the config does not describe, of RecipeOptions::module_params parameters
  kUnknown,  ///< none: the generic row (models/recipe.h)
};

/// What resolve_config chooses the recipe by, beyond the layers' keys.
struct RecipeOptions {
  RecipeModel model = RecipeModel::kConfig;
  /// kModule: the parameter count of the model (the Python package's nn.Module, summed over its
  /// blocks). Its batches come from the user's code, so the data counts as real.
  int64_t module_params = 0;
  /// A checkpoint being resumed with model.init_from set: its config.json describes the model, as
  /// the run reads it (the init_from directory may be gone).
  std::string resume_dir;
};

/// Where the value of one key a recipe sets came from.
struct KeyOrigin {
  std::string key;
  /// "recipe"; "built-in default" where no recipe applies (optim.type sgd or lion); or the name of
  /// the last layer that set it.
  std::string origin;
};

/// A configuration with the recipe under it and where each recipe key's value came from.
struct ResolvedConfig {
  Config config;
  const RecipeRow* recipe = nullptr;  ///< the row laid under the layers; null when optim.type takes none
  int64_t model_params = 0;           ///< the count the row was chosen by (0: unknown size)
  std::string model;                  ///< what it counts: "preset 125M", "model.init_from <dir>", ...
  DataKind data = DataKind::kSynthetic;
  std::vector<KeyOrigin> origins;  ///< one per recipe_keys(), in that order
};

/// The layers over the defaults and the recipe, validated (validate_config); each layer's warnings
/// are logged once. UserError from a layer, the model's description or the validation.
ResolvedConfig resolve_config(const std::vector<ConfigLayer>& layers, const RecipeOptions& options = {});

/// Lines for `tandem inspect`: the recipe row, its source, and each recipe key's value and origin.
std::string format_recipe(const ResolvedConfig& r);

}  // namespace tandem
