#include "tandem/cli/report_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tandem/monitor/report.h"

namespace tandem {

ReportCommand::ReportCommand(CLI::App& app) {
  command_ = app.add_subcommand("report", "write RUN_DIR/report.html: plots, summary and config, offline");
  command_->add_option("run_dir", run_dir_, "run directory")->required();
  command_->add_option("-o,--output", output_, "where to write it (default RUN_DIR/report.html)");
}

bool ReportCommand::chosen() const { return command_->parsed(); }

int ReportCommand::run() {
  std::printf("%s\n", write_report(run_dir_, output_).c_str());
  return 0;
}

}  // namespace tandem
