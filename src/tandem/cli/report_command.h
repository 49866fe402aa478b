#pragma once
// `tandem report RUN_DIR`: RUN_DIR/report.html (plots, summary, configuration), offline.

#include <string>

#include "tandem/cli/command.h"

namespace CLI {
class App;
}

namespace tandem {

class ReportCommand : public Command {
 public:
  explicit ReportCommand(CLI::App& app);
  bool chosen() const override;
  int run() override;

 private:
  CLI::App* command_ = nullptr;
  std::string run_dir_, output_;
};

}  // namespace tandem
