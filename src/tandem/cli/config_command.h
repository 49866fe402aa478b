#pragma once
// `tandem config`: the resolved configuration as YAML, or with --keys every key with its type and
// meaning.

#include "tandem/cli/command.h"
#include "tandem/cli/config_args.h"

namespace CLI {
class App;
}

namespace tandem {

class ConfigCommand : public Command {
 public:
  explicit ConfigCommand(CLI::App& app);
  bool chosen() const override;
  int run() override;

 private:
  CLI::App* command_ = nullptr;
  ConfigArgs args_;
  bool list_keys_ = false;
};

}  // namespace tandem
