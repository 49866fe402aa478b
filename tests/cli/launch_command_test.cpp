// `tandem launch` in-process (cli/launch_command.h; runs that start workers in a forked child): its
// options reach the workers, the command after `--` keeps its own options, the launcher exits with
// the workers' code, and bad values are refused before any worker starts.

#include "tandem/cli/launch_command.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"

namespace tandem {
namespace {

using test::error_of;
using test::read_text;

void parse(CLI::App& app, const std::vector<std::string>& argv) {
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
}

struct Launched {
  int code = -1;  ///< the launcher's exit code; -1 when it had to be killed
  std::string out, err;
};

// `tandem <argv>` through LaunchCommand in a forked child, stdout and stderr to files.
Launched launch_cli(const std::vector<std::string>& argv) {
  CLI::App app{"launch test"};
  LaunchCommand command(app);
  parse(app, argv);
  EXPECT_TRUE(command.chosen());
  test::TempDir dir;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(dir.file("out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(dir.file("err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    int code = 99;
    try {
      code = command.run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "run threw: %s\n", e.what());
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
  }
  Launched r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(dir.file("out"));
  r.err = read_text(dir.file("err"));
  return r;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// The UserError run() throws (refused before any process starts, so in this process).
std::string refusal(const std::vector<std::string>& argv) {
  CLI::App app{"launch test"};
  LaunchCommand command(app);
  parse(app, argv);
  return error_of([&] { command.run(); });
}

TEST(LaunchCommand, NeedsAWorkerCommandAndNumbersWhereNumbersGo) {
  for (const std::vector<std::string>& argv :
       std::vector<std::vector<std::string>>{{"launch"},
                                             {"launch", "--nproc-per-node", "2"},
                                             {"launch", "--master-port", "http", "--", "true"},
                                             {"launch", "--nnodes", "two", "--", "true"},
                                             {"launch", "--stop-grace", "soon", "--", "true"}}) {
    CLI::App app{"launch test"};
    LaunchCommand command(app);
    EXPECT_THROW(parse(app, argv), CLI::ParseError) << argv.back();
  }
  CLI::App app{"launch test"};
  app.add_subcommand("other", "another command");
  LaunchCommand command(app);
  parse(app, {"other"});
  EXPECT_FALSE(command.chosen());
}

TEST(LaunchCommand, BadValuesAreRefusedBeforeAnyWorkerStarts) {
  const std::vector<std::string> cmd = {"--", "/bin/sh", "-c", "exit 0"};
  const auto with = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), "launch");
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return refusal(argv);
  };
  EXPECT_NE(with({"--nproc-per-node", "0"}).find("--nproc-per-node '0' is not a worker count"), std::string::npos);
  EXPECT_NE(with({"--nproc-per-node", "4:2"}).find("MIN 4 is larger than MAX 2"), std::string::npos);
  EXPECT_NE(with({"--nproc-per-node", "two"}).find("--nproc-per-node 'two'"), std::string::npos);
  EXPECT_NE(with({"--nnodes", "2", "--node-rank", "2"}).find("--node-rank 2 is outside 0..1"), std::string::npos);
  EXPECT_NE(with({"--master-port", "70000"}).find("--master-port 70000 is outside 1..65535"), std::string::npos);
  EXPECT_NE(with({"--max-restarts", "-1"}).find("--max-restarts -1"), std::string::npos);
  EXPECT_NE(with({"--stop-grace", "-1"}).find("stop grace time -1 s"), std::string::npos);
  EXPECT_NE(with({"--nproc-per-node", "1:2", "--nnodes", "2"}).find("needs --nnodes 1"), std::string::npos);
}

TEST(LaunchCommand, TheWorkersGetTheTopologyAndRendezvousOfTheCommandLine) {
  test::TempDir dir;
  const Launched r =
      launch_cli({"launch", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3",
                  "--master-port", "29123", "--max-restarts", "3", "--stop-grace", "1", "--", "/bin/sh", "-c",
                  "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $NODE_RANK $MASTER_ADDR $MASTER_PORT "
                  "$TORCHELASTIC_MAX_RESTARTS\" > " +
                      dir.path() + "/env_$RANK"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("env_0"))) << "node 1 of 2 runs ranks 2 and 3";
  EXPECT_EQ(read_text(dir.file("env_2")), "2 0 4 2 1 10.1.2.3 29123 3\n");
  EXPECT_EQ(read_text(dir.file("env_3")), "3 1 4 2 1 10.1.2.3 29123 3\n");
}

// Options after `--` are the worker's: `--nproc-per-node` there is not the launcher's.
TEST(LaunchCommand, TheCommandAfterTheSeparatorKeepsItsOwnOptions) {
  const Launched r =
      launch_cli({"launch", "--", "/bin/sh", "-c", "echo \"$WORLD_SIZE $1 $2\"", "sh", "--nproc-per-node", "5"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] 1 --nproc-per-node 5\n") << "one worker, given the options as arguments";
}

TEST(LaunchCommand, OutputIsPrefixedWithTheRankUnlessAskedNotTo) {
  const std::vector<std::string> worker = {"--", "/bin/sh", "-c", "echo \"hello $RANK\"; echo \"oops $RANK\" >&2"};
  std::vector<std::string> argv = {"launch", "--nproc-per-node", "1:2"};
  argv.insert(argv.end(), worker.begin(), worker.end());
  const Launched prefixed = launch_cli(argv);
  EXPECT_EQ(prefixed.code, 0) << prefixed.err;
  EXPECT_EQ(sorted_lines(prefixed.out), (std::vector<std::string>{"[rank 0] hello 0", "[rank 1] hello 1"}))
      << "a range starts MAX workers";
  EXPECT_EQ(sorted_lines(prefixed.err), (std::vector<std::string>{"[rank 0] oops 0", "[rank 1] oops 1"}));
  argv.insert(argv.begin() + 1, "--no-prefix");
  const Launched bare = launch_cli(argv);
  EXPECT_EQ(bare.code, 0) << bare.err;
  EXPECT_EQ(sorted_lines(bare.out), (std::vector<std::string>{"hello 0", "hello 1"}));
}

TEST(LaunchCommand, ReturnsTheFailedWorkersExitCode) {
  const Launched r = launch_cli({"launch", "--nproc-per-node", "2", "--stop-grace", "1", "--", "/bin/sh", "-c",
                                 "if [ $RANK = 1 ]; then exit 3; fi; exit 0"});
  EXPECT_EQ(r.code, 3) << r.err;
}

}  // namespace
}  // namespace tandem
