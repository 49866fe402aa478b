#pragma once
// The options every command that reads a configuration shares (train, inspect, config, bench
// step): config files, a DeepSpeed JSON, --set, and the flags that stand for keys; resolved in
// layers (Note [Config layers]).

#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/io/config_layers.h"

namespace CLI {
class App;
}

namespace tandem {

struct ConfigArgs {
  std::vector<std::string> config_files;
  std::string deepspeed;
  std::vector<std::string> sets;
  // Every flag is kept as its text and set through its key, so it passes the key's own checks.
  std::string preset, device, init_from, run_dir, steps, metrics_port, dashboard_port;
  bool tensorboard = false;

  /// Registers the options on `app`; `training` adds those of a run (--steps, --run-dir, monitors).
  void add_to(CLI::App* app, bool training);
  /// defaults < recipe < resumed checkpoint's config < --config files < --deepspeed < flags < --set
  ResolvedConfig resolve_layers(const std::string& resume_dir) const;
  Config resolve(const std::string& resume_dir) const { return resolve_layers(resume_dir).config; }
};

}  // namespace tandem
