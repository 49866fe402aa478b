#pragma once
// A subcommand of `tandem`: its constructor registers it and its options on the app (cli/main.cpp
// builds one of each), chosen() says whether the command line named it, run() runs it.

namespace tandem {

class Command {
 public:
  virtual ~Command() = default;
  /// Whether the command line chose this subcommand.
  virtual bool chosen() const = 0;
  /// Runs it; returns the exit code. Bad input throws UserError (main prints it, exit code 2).
  virtual int run() = 0;
};

}  // namespace tandem
