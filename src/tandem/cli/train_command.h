#pragma once
// `tandem train`: a training run from the resolved configuration (run/trainer.h), new or resumed
// (--resume DIR | auto), until its steps end or a signal stops it after a step.

#include <string>

#include "tandem/cli/command.h"
#include "tandem/cli/config_args.h"

namespace CLI {
class App;
}

namespace tandem {

class TrainCommand : public Command {
 public:
  explicit TrainCommand(CLI::App& app);
  bool chosen() const override;
  int run() override;

 private:
  /// The checkpoint directory --resume names ("" for a fresh start).
  std::string resume_dir() const;

  CLI::App* command_ = nullptr;
  ConfigArgs args_;
  std::string resume_;
};

}  // namespace tandem
