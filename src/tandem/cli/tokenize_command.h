#pragma once
// `tandem tokenize --tokenizer T --out data/train.bin INPUT...`: a corpus into the token files
// `tandem train` reads (data/tokenize_corpus.h does the work; this draws progress and the summary).

#include <string>

#include "tandem/cli/command.h"
#include "tandem/data/tokenize_corpus.h"

namespace CLI {
class App;
}

namespace tandem {

/// The `tokenize` subcommand: its options on the command line and its run.
class TokenizeCommand : public Command {
 public:
  /// Registers the subcommand and its options on `app`.
  explicit TokenizeCommand(CLI::App& app);

  /// Whether the command line chose this subcommand.
  bool chosen() const override;

  /// Tokenizes; returns the exit code. Bad input throws UserError (main prints it, exit code 2).
  int run() override;

 private:
  CLI::App* command_ = nullptr;
  std::string tokenizer_, eos_;
  TokenizeCorpusOptions options_;
};

}  // namespace tandem
