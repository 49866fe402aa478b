#pragma once
// `tandem generate --checkpoint DIR --prompt "..."` (or --prompts FILE, one prompt per line, run as
// one batch through the continuous-batching scheduler): text streamed to stdout as it is generated,
// then time to first token, tokens/s and peak memory on stderr.

#include <string>
#include <vector>

#include "tandem/cli/command.h"
#include "tandem/serve/generation_model.h"
#include "tandem/serve/sampler.h"

namespace CLI {
class App;
}

namespace tandem {

/// The `generate` subcommand: its options on the command line and its run.
class GenerateCommand : public Command {
 public:
  /// Registers the subcommand and its options on `app`.
  explicit GenerateCommand(CLI::App& app);

  /// Whether the command line chose this subcommand.
  bool chosen() const override;

  /// Generates; returns the exit code. Bad input throws UserError (main prints it, exit code 2).
  int run() override;

 private:
  std::vector<std::string> prompts() const;

  CLI::App* command_ = nullptr;
  GenerationModelOptions model_;
  std::string prompt_, prompts_file_;
  int64_t max_tokens_ = 128;
  SamplingParams sampling_;
  std::vector<std::string> stop_;
  bool ignore_eos_ = false;
};

}  // namespace tandem
