#include "tandem/io/config_layers.h"

#include <cstdlib>
#include <filesystem>
#include <map>

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/io/checkpoint.h"
#include "tandem/formats/deepspeed.h"
#include "tandem/io/hf.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace fs = std::filesystem;

ConfigLayer config_file_layer(const std::string& path) {
  const auto dot = path.rfind('.');
  const std::string ext = dot == std::string::npos ? "" : to_lower(path.substr(dot + 1));
  if (ext == "json") return deepspeed_layer(path);
  TANDEM_CHECK(ext == "yaml" || ext == "yml", "config file '", path,
               "' has an unknown extension; use .yaml/.yml (tandem) or .json (DeepSpeed)");
  return {path, [path](Config& cfg, std::vector<std::string>&) { load_yaml_config(cfg, path); }};
}

ConfigLayer deepspeed_layer(const std::string& path) {
  return {path, [path](Config& cfg, std::vector<std::string>& warnings) {
            const auto r = load_deepspeed_config(cfg, path);
            for (const auto& note : r.notes) warnings.push_back(path + ": " + note);
            if (!r.ignored_keys.empty())
              warnings.push_back(
                  path + ": DeepSpeed keys without a tandem equivalent were ignored: " + join(r.ignored_keys, ", "));
          }};
}

ConfigLayer checkpoint_layer(const std::string& checkpoint_dir) {
  return {"checkpoint " + checkpoint_dir,
          [checkpoint_dir](Config& cfg, std::vector<std::string>&) { load_checkpoint_config(cfg, checkpoint_dir); }};
}

ConfigLayer key_layer(const std::string& name, std::vector<std::pair<std::string, std::string>> keys) {
  return {name, [name, keys = std::move(keys)](Config& cfg, std::vector<std::string>&) {
            for (const auto& [k, v] : keys) set_config_key(cfg, k, v, name);
          }};
}

namespace {

// Note [Config layers]
// A run's configuration is built in layers, each over the ones below:
//   built-in defaults (core/config.h; the generic recipe for the optim keys)
//   < the recipe of the model's size and the data (models/recipe.h, Note [Training recipes])
//   < a resumed checkpoint's config < config files (YAML, DeepSpeed JSON) < flags < --set
// The recipe depends on the layers above it (model.preset, model.init_from, data.path,
// train.steps, optim.type), so resolve_config applies them twice: once over the defaults, to learn
// the model, data and length, and once over the recipe chosen from them. The layers are plain
// assignments, so the second pass sets the same keys to the same values and a key a user gave
// always wins; nothing tracks "was this key set", and no source needs to know about recipes.
// Each recipe key's origin is the last layer that changed it in the second pass, else in the first
// (a user value equal to the recipe's changes nothing in the second), else the recipe. A user
// value equal to both the built-in default and the recipe shows as the recipe's: the same value.

using Snapshot = std::vector<std::string>;

Snapshot snapshot(const Config& cfg) {
  Snapshot s;
  for (const auto& k : recipe_keys()) s.push_back(get_config_key(cfg, k));
  return s;
}

/// Applies every layer to cfg; for each recipe key, the name of the last layer that changed it.
std::map<std::string, std::string> apply_layers(Config& cfg, const std::vector<ConfigLayer>& layers,
                                                std::vector<std::string>& warnings) {
  std::map<std::string, std::string> changed_by;
  for (const auto& layer : layers) {
    const Snapshot before = snapshot(cfg);
    layer.apply(cfg, warnings);
    const Snapshot after = snapshot(cfg);
    for (size_t i = 0; i < after.size(); ++i)
      if (after[i] != before[i]) changed_by[recipe_keys()[i]] = layer.name;
  }
  return changed_by;
}

}  // namespace

ResolvedConfig resolve_config(const std::vector<ConfigLayer>& layers, const RecipeOptions& options) {
  ResolvedConfig r;
  std::vector<std::string> ignored;
  Config first;
  const auto first_changed = apply_layers(first, layers, ignored);

  if (recipe_applies(first.optim.type)) {
    switch (options.model) {
      case RecipeModel::kConfig: {
        const bool hf = !first.model.init_from.empty();
        const std::string dir = options.resume_dir.empty() ? first.model.init_from : options.resume_dir;
        const ModelSpec spec =
            hf ? spec_from_hf_config((fs::path(dir) / "config.json").string()) : resolve_model_spec(first.model);
        r.model_params = spec.num_params_unpadded();
        r.model = hf ? "model.init_from " + first.model.init_from : "preset " + spec.name;
        r.data = first.data.kind();
        r.recipe = &recipe_row(r.model_params, r.data);
        break;
      }
      case RecipeModel::kModule:
        TANDEM_ASSERT(options.module_params > 0, "a module of ", options.module_params, " parameters");
        r.model_params = options.module_params;
        r.model = "the module";
        r.data = DataKind::kReal;
        r.recipe = &recipe_row(r.model_params, r.data);
        break;
      case RecipeModel::kUnknown:
        r.model = "a model of unknown size";
        r.data = first.data.kind();
        r.recipe = &generic_recipe_row();
        break;
    }
  }

  std::vector<std::string> warnings;
  if (r.recipe) apply_recipe(*r.recipe, first.train.steps, r.config.optim);
  const auto changed = apply_layers(r.config, layers, warnings);
  for (const auto& k : recipe_keys()) {
    std::string origin = r.recipe ? "recipe" : "built-in default";
    if (const auto it = changed.find(k); it != changed.end())
      origin = it->second;
    else if (const auto it1 = first_changed.find(k); it1 != first_changed.end())
      origin = it1->second;
    r.origins.push_back({k, origin});
  }
  validate_config(r.config);
  for (const auto& w : warnings) log::warn(w);
  return r;
}

std::string format_recipe(const ResolvedConfig& r) {
  const Config& c = r.config;
  std::string out;
  if (r.recipe) {
    const std::string model =
        r.model_params > 0 ? format_count(double(r.model_params)) + " parameters (" + r.model + ")" : r.model;
    out += strprintf("training recipe: %s (%s)\n  for %s on %s data, %lld steps\n", r.recipe->name, r.recipe->source,
                     model.c_str(), to_string(r.data), static_cast<long long>(c.train.steps));
  } else {
    out += strprintf("training recipe: none for optim.type=%s (the rows are AdamW runs): built-in defaults\n",
                     to_string(c.optim.type));
  }
  for (const auto& o : r.origins) {
    std::string value = get_config_key(c, o.key);
    char* end = nullptr;
    const double x = std::strtod(value.c_str(), &end);
    if (!value.empty() && end && *end == '\0') value = strprintf("%g", x);
    std::string origin = o.origin;
    if (o.key == "optim.warmup_steps" && origin == "recipe")
      origin += strprintf(": 10%% of %lld steps, at most the source's %lld", static_cast<long long>(c.train.steps),
                          static_cast<long long>(r.recipe->published_warmup));
    if (o.key == "optim.min_lr_ratio" && c.optim.schedule == LrSchedule::kConstant) origin += " (unused: constant)";
    out += strprintf("  %-20s %-10s %s\n", o.key.c_str(), value.c_str(), origin.c_str());
  }
  return out;
}

}  // namespace tandem
