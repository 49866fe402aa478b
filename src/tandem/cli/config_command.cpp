#include "tandem/cli/config_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tandem/core/config.h"

namespace tandem {

ConfigCommand::ConfigCommand(CLI::App& app) {
  command_ = app.add_subcommand("config", "print the resolved configuration as YAML, or list every key");
  args_.add_to(command_, true);
  command_->add_flag("--keys", list_keys_, "list every key with its type and meaning");
}

bool ConfigCommand::chosen() const { return command_->parsed(); }

int ConfigCommand::run() {
  if (list_keys_) {
    for (const auto& k : config_keys()) std::printf("%-26s %-22s %s\n", k.name.c_str(), k.type.c_str(), k.doc.c_str());
    return 0;
  }
  std::fputs(config_to_yaml(args_.resolve("")).c_str(), stdout);
  return 0;
}

}  // namespace tandem
