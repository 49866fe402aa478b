#pragma once
// `tandem dashboard RUN_DIR`: the live page over a run's metrics.jsonl, re-read on each poll (a
// finished run, or one another process writes), until SIGINT or SIGTERM.

#include <string>

#include "tandem/cli/command.h"

namespace CLI {
class App;
}

namespace tandem {

class DashboardCommand : public Command {
 public:
  explicit DashboardCommand(CLI::App& app);
  bool chosen() const override;
  int run() override;

 private:
  CLI::App* command_ = nullptr;
  std::string run_dir_, bind_ = "127.0.0.1", chartjs_;
  int port_ = 8080;
};

}  // namespace tandem
