#pragma once
// `tandem launch --nproc-per-node N -- CMD...`: worker processes with torchrun's environment
// (parallel/launcher.h), their output passed on by rank, restarted on failure.

#include <string>

#include "tandem/cli/command.h"
#include "tandem/parallel/launcher.h"

namespace CLI {
class App;
}

namespace tandem {

class LaunchCommand : public Command {
 public:
  explicit LaunchCommand(CLI::App& app);
  bool chosen() const override;
  int run() override;

 private:
  CLI::App* command_ = nullptr;
  LaunchOptions options_;
  std::string nproc_ = "1";
  bool no_prefix_ = false;
};

}  // namespace tandem
