#pragma once
// `tandem serve --checkpoint DIR`: the OpenAI-compatible HTTP server (serve/http_server.h) over a
// model folder (serve/completion_service.h), until SIGINT or SIGTERM, which drain it (Note [Graceful
// drain]).

#include <string>

#include "tandem/cli/command.h"
#include "tandem/serve/completion_service.h"
#include "tandem/serve/http_server.h"

namespace CLI {
class App;
}

namespace tandem {

/// The `serve` subcommand: its options on the command line and its run.
class ServeCommand : public Command {
 public:
  /// Registers the subcommand and its options on `app`.
  explicit ServeCommand(CLI::App& app);

  /// Whether the command line chose this subcommand.
  bool chosen() const override;

  /// Serves until a signal; returns the exit code. Bad input throws UserError (exit code 2).
  int run() override;

 private:
  CLI::App* command_ = nullptr;
  CompletionServiceOptions service_;
  HttpServerOptions http_;
  double max_body_mib_ = 16;
  double drain_timeout_s_ = 30;
};

}  // namespace tandem
