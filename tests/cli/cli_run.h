#pragma once
// The tandem binary run as a user runs it, for the CLI's end-to-end tests: its exit code and what
// it wrote to stdout and stderr.

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "../test_util.h"

namespace tandem::test {

struct CliResult {
  int code = -1;  ///< the exit code; -1 when a signal ended it
  std::string out, err;
};

/// `tandem <args>` through the shell, its output captured.
inline CliResult run_cli(const std::string& args) {
  TempDir tmp;
  const std::string cmd = cli_path() + " " + args + " >" + tmp.file("out") + " 2>" + tmp.file("err");
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(tmp.file("out"));
  r.err = read_text(tmp.file("err"));
  return r;
}

}  // namespace tandem::test
