#pragma once
// `tandem chat --checkpoint DIR`: a conversation in the terminal. Each line read from stdin is the
// user's turn; the whole conversation is laid out in the model's chat format and the reply streams
// to stdout as it is generated, through the same CompletionService that `tandem serve` runs
// (Note [Chat in the terminal]).

#include <cstdint>
#include <string>

#include "tandem/cli/command.h"
#include "tandem/serve/completion_service.h"
#include "tandem/serve/sampler.h"

namespace CLI {
class App;
}

namespace tandem {

/// The `chat` subcommand: its options on the command line and its run.
class ChatCommand : public Command {
 public:
  /// Registers the subcommand and its options on `app`.
  explicit ChatCommand(CLI::App& app);

  /// Whether the command line chose this subcommand.
  bool chosen() const override;

  /// Converses until EOF or /exit; returns the exit code. Bad input throws UserError (exit code 2).
  int run() override;

 private:
  /// The request of an empty conversation: the system message, max tokens and sampling.
  CompletionRequest opening() const;

  CLI::App* command_ = nullptr;
  CompletionServiceOptions service_;
  std::string system_;
  int64_t max_tokens_ = 512;
  SamplingParams sampling_;
};

}  // namespace tandem
