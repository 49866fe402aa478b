#pragma once
// `tandem inspect`: the model, its parameters, the memory estimate per device, and with --plan the
// offload engine's memory plan of every rank of a layout (Note [Plan layout]).

#include <cstdint>
#include <string>

#include "tandem/cli/command.h"
#include "tandem/cli/config_args.h"
#include "tandem/cli/partition_command.h"
#include "tandem/io/config_layers.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace tandem {

/// `tandem inspect` options beyond the configuration.
struct InspectOptions {
  bool plan = false;             ///< print the offload engine's memory plan instead of the estimate without it
  double gpu_memory_gib = 80.0;  ///< GPU to plan for when none is visible, or when given explicitly
  bool gpu_memory_given = false;
  double host_memory_gib = 0.0;  ///< 0 = MemAvailable from /proc/meminfo
  bool partition = false;        ///< profile the Blocks and print the pipeline partitioner's plan
  PartitionInspectOptions partition_opts;
  /// Ranks (one GPU each, on one host) to plan for: with dist.zero_stage and dist.pipeline_stages
  /// their layout; a plan per pipeline stage.
  int64_t ranks = 1;
  /// Where to write the model's Hugging Face config.json (for a peer that builds the same
  /// architecture), before anything is printed; empty: nowhere.
  std::string hf_config;
};

/// Prints what `tandem inspect` shows for `resolved`; returns the exit code. UserError when a plan
/// asked for does not fit.
int run_inspect(const ResolvedConfig& resolved, const InspectOptions& opts);

/// The `inspect` subcommand: the configuration's options and InspectOptions on the command line.
class InspectCommand : public Command {
 public:
  explicit InspectCommand(CLI::App& app);
  bool chosen() const override;
  int run() override;

 private:
  CLI::App* command_ = nullptr;
  CLI::Option* gpu_memory_ = nullptr;
  ConfigArgs args_;
  InspectOptions options_;
};

}  // namespace tandem
