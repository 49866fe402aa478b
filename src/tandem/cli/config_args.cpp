#include "tandem/cli/config_args.h"

#include <CLI/CLI.hpp>

#include "tandem/core/strings.h"
#include "tandem/models/spec.h"

namespace tandem {

void ConfigArgs::add_to(CLI::App* app, bool training) {
  app->add_option("-c,--config", config_files,
                  "YAML config (tandem keys, nested or dotted); .json = DeepSpeed; repeatable")
      ->check(CLI::ExistingFile);
  app->add_option("--deepspeed", deepspeed, "DeepSpeed JSON config: the keys that map are used, the rest listed")
      ->check(CLI::ExistingFile);
  app->add_option("-s,--set", sets, "override one key: --set train.steps=100 (repeatable; `tandem config --keys`)");
  app->add_option("-p,--preset", preset, "model preset: " + join(preset_names(), ", "));
  app->add_option("--device", device, "auto | cpu | cuda | cuda:N");
  app->add_option("--init-from", init_from,
                  "start from an HF model folder (config.json + safetensors: Llama, Qwen2, Mistral, Gemma, Gemma2, "
                  "Phi-3, GPT-2)");
  if (!training) return;
  app->add_option("--steps", steps, "optimizer steps (train.steps)");
  app->add_option("--run-dir", run_dir, "run directory (default runs/<date>-<time>-<preset>)");
  app->add_option("--metrics-port", metrics_port,
                  "serve Prometheus /metrics on this port (loopback; monitor.bind to change)");
  app->add_option("--dashboard", dashboard_port, "serve the live dashboard on this port (loopback)");
  app->add_flag("--tensorboard", tensorboard, "write TensorBoard scalars to <run dir>/tensorboard");
}

// Note [Config layers]
ResolvedConfig ConfigArgs::resolve_layers(const std::string& resume_dir) const {
  std::vector<ConfigLayer> layers;
  if (!resume_dir.empty()) layers.push_back(checkpoint_layer(resume_dir));
  for (const auto& f : config_files) layers.push_back(config_file_layer(f));
  if (!deepspeed.empty()) layers.push_back(deepspeed_layer(deepspeed));
  layers.push_back({"flags", [this](Config& cfg, std::vector<std::string>&) {
                      struct Flag {
                        const std::string& value;
                        const char *key, *name;
                      };
                      const Flag flags[] = {{preset, "model.preset", "--preset"},
                                            {device, "train.device", "--device"},
                                            {init_from, "model.init_from", "--init-from"},
                                            {steps, "train.steps", "--steps"},
                                            {run_dir, "train.run_dir", "--run-dir"},
                                            {metrics_port, "monitor.metrics_port", "--metrics-port"},
                                            {dashboard_port, "monitor.dashboard_port", "--dashboard"}};
                      for (const Flag& f : flags)
                        if (!f.value.empty()) set_config_key(cfg, f.key, f.value, f.name);
                      if (tensorboard) set_config_key(cfg, "monitor.tensorboard", "true", "--tensorboard");
                    }});
  layers.push_back({"--set", [this](Config& cfg, std::vector<std::string>&) {
                      for (const auto& s : sets) apply_override(cfg, s);
                    }});
  RecipeOptions recipe;
  recipe.resume_dir = resume_dir;
  return resolve_config(layers, recipe);
}

}  // namespace tandem
