#include "tandem/parallel/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

// Worker commands are small /bin/sh scripts. launch() runs in a forked child wherever a test sets
// the launcher's environment, reads its stdout or stderr, or signals it; the child's files are
// read after it exits.

namespace tandem {
namespace {

using test::read_text;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool exists(const std::string& path) { return std::filesystem::exists(path); }

/// Options for `n` workers running `/bin/sh -c script`, with short stop and restart pauses.
LaunchOptions sh_options(const std::string& script, int n) {
  LaunchOptions o;
  o.min_procs = o.max_procs = n;
  o.stop_grace_s = 2;
  o.restart_delay_s = 0.05;
  o.command = {"/bin/sh", "-c", script};
  return o;
}

/// An environment change made in the launcher's process before launch(): a value, or unset.
struct EnvEdit {
  std::string key;
  const char* value;  // nullptr: unset
};

/// Runs launch(o) in a forked child whose stdout and stderr go to dir's files "launcher.out" and
/// "launcher.err"; returns the child's pid.
pid_t start_launcher(const LaunchOptions& o, const test::TempDir& dir, const std::vector<EnvEdit>& env = {}) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int out = open(dir.file("launcher.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = open(dir.file("launcher.err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(out, 1);
  dup2(err, 2);
  for (const EnvEdit& e : env) {
    if (e.value != nullptr)
      setenv(e.key.c_str(), e.value, 1);
    else
      unsetenv(e.key.c_str());
  }
  int code = 0;
  try {
    code = launch(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch threw: %s\n", e.what());
    code = 99;
  }
  std::fflush(stderr);
  _exit(code);
}

/// The launcher child's exit code (128 + s when killed by signal s), or -1 when it was still
/// running after timeout_s (then it is killed).
int wait_launcher(pid_t pid, double timeout_s = 15) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

int run_launcher(const LaunchOptions& o, const test::TempDir& dir, const std::vector<EnvEdit>& env = {}) {
  return wait_launcher(start_launcher(o, dir, env));
}

/// True once every path exists, false after timeout_s.
bool wait_for_files(const std::vector<std::string>& paths, double timeout_s = 5) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::all_of(paths.begin(), paths.end(), exists)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

/// How many processes of process group `pgid` are still alive (zombies left out), from /proc.
int live_members(pid_t pgid) {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;  // not a process
    const std::string stat = read_text(entry.path().string() + "/stat");      // "pid (comm) state ppid pgrp ..."
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (fields >> state >> ppid >> pgrp && pgrp == pgid && state != 'Z' && state != 'X') ++n;
  }
  return n;
}

/// True once no process of group `pgid` is alive, false after timeout_s.
bool group_gone(pid_t pgid, double timeout_s = 3) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (live_members(pgid) > 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// `script` with every "@D" replaced by dir's path.
std::string in_dir(std::string script, const test::TempDir& dir) {
  for (size_t at; (at = script.find("@D")) != std::string::npos;) script.replace(at, 2, dir.path());
  return script;
}

TEST(Launcher, GivesEachWorkerTheTorchrunEnvironment) {
  test::TempDir dir;
  const std::string script =
      "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
      "$TORCHELASTIC_RESTART_COUNT $TANDEM_DEVICE_INDEX $GROUP_RANK $NODE_RANK "
      "$TORCHELASTIC_MAX_RESTARTS $TANDEM_LAUNCHED $OMP_NUM_THREADS $LAUNCHER_TEST_KEPT\" > @D/env_$RANK";
  LaunchOptions o = sh_options(in_dir(script, dir), 3);
  o.master_addr = "10.0.0.7";
  o.master_port = 23456;
  o.max_restarts = 2;
  // A stale RANK in the launcher's environment is replaced; other keys pass through.
  ASSERT_EQ(run_launcher(o, dir, {{"OMP_NUM_THREADS", nullptr}, {"RANK", "99"}, {"LAUNCHER_TEST_KEPT", "kept"}}), 0)
      << read_text(dir.file("launcher.err"));
  const int omp = std::max(1, static_cast<int>(allowed_cpus().size()) / 3);
  for (int r = 0; r < 3; ++r) {
    const std::string l = std::to_string(r);
    EXPECT_EQ(read_text(dir.file("env_" + l)),
              l + " " + l + " 3 3 10.0.0.7 23456 0 " + l + " 0 0 2 1 " + std::to_string(omp) + " kept\n");
  }

  // The second of two nodes: ranks start at node_rank * n; OMP_NUM_THREADS set outside is kept.
  test::TempDir dir2;
  LaunchOptions o2 = sh_options(in_dir("echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $NODE_RANK "
                                       "$TANDEM_DEVICE_INDEX $OMP_NUM_THREADS\" > @D/env_$RANK",
                                       dir2),
                                3);
  o2.nnodes = 2;
  o2.node_rank = 1;
  ASSERT_EQ(run_launcher(o2, dir2, {{"OMP_NUM_THREADS", "5"}}), 0) << read_text(dir2.file("launcher.err"));
  for (int l = 0; l < 3; ++l) {
    EXPECT_FALSE(exists(dir2.file("env_" + std::to_string(l))));
    EXPECT_EQ(read_text(dir2.file("env_" + std::to_string(3 + l))),
              std::to_string(3 + l) + " " + std::to_string(l) + " 6 3 1 1 " + std::to_string(l) + " 5\n");
  }
}

TEST(Launcher, PrefixesWholeLinesWithTheRank) {
  test::TempDir dir;
  // Lines longer than a pipe's buffer arrive in pieces; they must still go out whole and unmixed.
  const std::string script =
      "case $RANK in 0) c=a;; 1) c=b;; *) c=c;; esac\n"
      "line=$(printf '%70000s' '' | tr ' ' $c)\n"
      "i=0; while [ $i -lt 10 ]; do echo \"$line\"; i=$((i+1)); done\n"
      "echo \"err-$RANK\" >&2\n"
      "printf \"tail-$RANK\"\n";
  ASSERT_EQ(run_launcher(sh_options(script, 3), dir), 0) << read_text(dir.file("launcher.err"));
  const std::string out = read_text(dir.file("launcher.out"));
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), '\n');  // the final partial lines got their own line end
  std::map<int, int> long_lines, tails;
  for (const std::string& line : lines_of(out)) {
    ASSERT_EQ(line.rfind("[rank ", 0), 0u) << line.substr(0, 80);
    const int r = line[6] - '0';
    ASSERT_TRUE(r >= 0 && r < 3) << line.substr(0, 80);
    const std::string prefix = "[rank " + std::to_string(r) + "] ";
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << line.substr(0, 80);
    const std::string body = line.substr(prefix.size());
    if (body == "tail-" + std::to_string(r)) {
      ++tails[r];
    } else {
      ASSERT_EQ(body, std::string(70000, static_cast<char>('a' + r))) << "a mixed or split line from rank " << r;
      ++long_lines[r];
    }
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(long_lines[r], 10) << "rank " << r;
    EXPECT_EQ(tails[r], 1) << "rank " << r;
  }
  std::vector<std::string> err = lines_of(read_text(dir.file("launcher.err")));
  std::sort(err.begin(), err.end());
  EXPECT_EQ(err, (std::vector<std::string>{"[rank 0] err-0", "[rank 1] err-1", "[rank 2] err-2"}));
}

TEST(Launcher, PassesLinesOnBareWithoutPrefix) {
  test::TempDir dir;
  LaunchOptions o = sh_options("echo \"hello $RANK\"", 2);
  o.prefix_output = false;
  ASSERT_EQ(run_launcher(o, dir), 0) << read_text(dir.file("launcher.err"));
  std::vector<std::string> out = lines_of(read_text(dir.file("launcher.out")));
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"hello 0", "hello 1"}));
}

TEST(Launcher, ReturnsTheFailedWorkersCodeAndStopsTheOthers) {
  test::TempDir dir;
  // Rank 1 starts a sleep in its process group, notes its pid and waits; it would write the
  // marker after 30 s. Rank 0 fails once rank 1 is up.
  const std::string script = in_dir(
      "if [ $RANK = 0 ]; then\n"
      "  while [ ! -e @D/pid ]; do sleep 0.02; done; exit 3\n"
      "fi\n"
      "trap 'touch @D/got_term; exit 143' TERM\n"
      "sleep 30 & echo $$ > @D/pid.tmp; mv @D/pid.tmp @D/pid\n"
      "wait; touch @D/marker\n",
      dir);
  LaunchOptions o = sh_options(script, 2);
  o.stop_grace_s = 10;  // SIGTERM stops rank 1, not the SIGKILL after the grace time
  EXPECT_EQ(run_launcher(o, dir), 3);
  EXPECT_TRUE(exists(dir.file("got_term")));
  EXPECT_FALSE(exists(dir.file("marker")));
  const pid_t pgid = std::stoi(read_text(dir.file("pid")));
  EXPECT_TRUE(group_gone(pgid)) << "rank 1's sleep outlived the launcher";
  const std::string err = read_text(dir.file("launcher.err"));
  EXPECT_NE(err.find("tandem launch: rank 0 exited with code 3; stopping the other 1 worker\n"), std::string::npos)
      << err;
}

TEST(Launcher, KillsAWorkerThatIgnoresSigtermAfterTheGraceTime) {
  test::TempDir dir;
  const std::string script = in_dir(
      "if [ $RANK = 0 ]; then\n"
      "  while [ ! -e @D/ready ]; do sleep 0.02; done; exit 1\n"
      "fi\n"
      "trap '' TERM; sleep 30 & touch @D/ready; wait; touch @D/marker\n",
      dir);
  LaunchOptions o = sh_options(script, 2);
  o.stop_grace_s = 0.3;
  EXPECT_EQ(run_launcher(o, dir), 1);
  EXPECT_FALSE(exists(dir.file("marker")));
  EXPECT_NE(read_text(dir.file("launcher.err")).find("tandem launch: 1 worker still running 0.3s after SIGTERM"),
            std::string::npos)
      << read_text(dir.file("launcher.err"));
}

TEST(Launcher, RestartsAFailedAttemptWhileRestartsRemain) {
  // One worker: with two, the one that fails may stop the other before it notes its attempt.
  const auto attempts_script = [](const test::TempDir& dir) {
    return in_dir("echo $TORCHELASTIC_RESTART_COUNT >> @D/attempts\n[ $TORCHELASTIC_RESTART_COUNT -ge 1 ] || exit 4\n",
                  dir);
  };
  test::TempDir dir;
  LaunchOptions o = sh_options(attempts_script(dir), 1);
  o.max_restarts = 1;
  EXPECT_EQ(run_launcher(o, dir), 0) << read_text(dir.file("launcher.err"));
  EXPECT_EQ(read_text(dir.file("attempts")), "0\n1\n");
  EXPECT_NE(read_text(dir.file("launcher.err")).find("tandem launch: restart 1 of 1"), std::string::npos);

  test::TempDir dir2;
  LaunchOptions o2 = sh_options(attempts_script(dir2), 1);
  o2.max_restarts = 0;
  EXPECT_EQ(run_launcher(o2, dir2), 4);
  EXPECT_EQ(read_text(dir2.file("attempts")), "0\n");
}

// Exit code 2 is refused input: the same command would be refused again, so no restart and no
// hint to resume.
TEST(Launcher, ARefusedInputIsNotRestarted) {
  test::TempDir dir;
  LaunchOptions o = sh_options(in_dir("echo $TORCHELASTIC_RESTART_COUNT >> @D/attempts\nexit 2\n", dir), 1);
  o.max_restarts = 3;
  EXPECT_EQ(run_launcher(o, dir), 2);
  EXPECT_EQ(read_text(dir.file("attempts")), "0\n");
  const std::string err = read_text(dir.file("launcher.err"));
  EXPECT_NE(err.find("refused its input (exit 2): not restarted"), std::string::npos) << err;
  EXPECT_EQ(err.find("--resume auto"), std::string::npos) << err;
}

TEST(Launcher, CountsAWorkerKilledBySignalAs128PlusSignal) {
  test::TempDir dir;
  EXPECT_EQ(run_launcher(sh_options("kill -9 $$", 1), dir), 137);
  EXPECT_NE(read_text(dir.file("launcher.err")).find("tandem launch: rank 0 was killed by signal 9 (SIGKILL)"),
            std::string::npos)
      << read_text(dir.file("launcher.err"));
}

TEST(Launcher, ReportsACommandThatCannotRun) {
  test::TempDir dir;
  LaunchOptions o = sh_options("", 1);
  o.command = {"/nonexistent/tandem-launcher-test-binary"};
  EXPECT_EQ(run_launcher(o, dir), 127);
  EXPECT_NE(read_text(dir.file("launcher.err"))
                .find("[rank 0] tandem launch: cannot run /nonexistent/tandem-launcher-test-binary: No such file"),
            std::string::npos)
      << read_text(dir.file("launcher.err"));
}

TEST(Launcher, ForwardsSigtermToTheWorkersAndDoesNotRestart) {
  test::TempDir dir;
  const std::string script = in_dir(
      "trap 'touch @D/term_$RANK; exit 0' TERM\n"
      "echo $TORCHELASTIC_RESTART_COUNT >> @D/attempts_$RANK\n"
      "sleep 30 & touch @D/ready_$RANK; wait\n",
      dir);
  LaunchOptions o = sh_options(script, 2);
  o.max_restarts = 3;
  const pid_t launcher = start_launcher(o, dir);
  ASSERT_TRUE(wait_for_files({dir.file("ready_0"), dir.file("ready_1")})) << read_text(dir.file("launcher.err"));
  kill(launcher, SIGTERM);
  EXPECT_EQ(wait_launcher(launcher), 0) << read_text(dir.file("launcher.err"));
  EXPECT_TRUE(exists(dir.file("term_0")));
  EXPECT_TRUE(exists(dir.file("term_1")));
  EXPECT_EQ(read_text(dir.file("attempts_0")), "0\n");  // no restart after a forwarded signal
  EXPECT_NE(read_text(dir.file("launcher.err")).find("tandem launch: got SIGTERM; passing it on to 2 workers"),
            std::string::npos)
      << read_text(dir.file("launcher.err"));
}

TEST(Launcher, KillsTheWorkersOnASecondSignal) {
  test::TempDir dir;
  const std::string script = in_dir("trap '' INT; sleep 30 & touch @D/ready_$RANK; wait; touch @D/marker\n", dir);
  const pid_t launcher = start_launcher(sh_options(script, 2), dir);
  ASSERT_TRUE(wait_for_files({dir.file("ready_0"), dir.file("ready_1")})) << read_text(dir.file("launcher.err"));
  kill(launcher, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // two pending SIGINTs would be one
  EXPECT_FALSE(exists(dir.file("marker")));                     // the first one was passed on and ignored
  kill(launcher, SIGINT);
  EXPECT_EQ(wait_launcher(launcher), 137) << read_text(dir.file("launcher.err"));
  EXPECT_FALSE(exists(dir.file("marker")));
  EXPECT_NE(read_text(dir.file("launcher.err")).find("tandem launch: got SIGINT again; killing the workers"),
            std::string::npos)
      << read_text(dir.file("launcher.err"));
}

TEST(Launcher, DropsASlotThatFailedTwiceAndGoesOnWithFewerWorkers) {
  for (const int broken : {1, 0}) {
    SCOPED_TRACE("broken slot " + std::to_string(broken));
    test::TempDir dir;
    // The broken slot's worker always fails, once every worker has noted its attempt.
    const std::string script = in_dir(
        "notes=@D/attempt_$TORCHELASTIC_RESTART_COUNT\n"
        "echo \"$WORLD_SIZE $RANK $TANDEM_DEVICE_INDEX\" >> $notes\n"
        "[ $TANDEM_DEVICE_INDEX = " +
            std::to_string(broken) +
            " ] || exit 0\n"
            "while [ $(wc -l < $notes) -lt $LOCAL_WORLD_SIZE ]; do sleep 0.02; done\n"
            "exit 1\n",
        dir);
    LaunchOptions o = sh_options(script, 2);
    o.min_procs = 1;
    o.max_procs = 2;
    o.max_restarts = 3;
    EXPECT_EQ(run_launcher(o, dir), 0) << read_text(dir.file("launcher.err"));
    for (const char* attempt : {"attempt_0", "attempt_1"}) {
      std::vector<std::string> lines = lines_of(read_text(dir.file(attempt)));
      std::sort(lines.begin(), lines.end());
      EXPECT_EQ(lines, (std::vector<std::string>{"2 0 0", "2 1 1"})) << attempt;
    }
    // One worker, rank 0, on the slot that works.
    EXPECT_EQ(read_text(dir.file("attempt_2")), "1 0 " + std::to_string(1 - broken) + "\n");
    EXPECT_FALSE(exists(dir.file("attempt_3")));
    const std::string err = read_text(dir.file("launcher.err"));
    EXPECT_NE(err.find("tandem launch: restart 1 of 3\n"), std::string::npos) << err;
    EXPECT_NE(err.find("tandem launch: slot " + std::to_string(broken) + " failed twice; going on with 1 worker\n"),
              std::string::npos)
        << err;
    EXPECT_EQ(err.find("failed twice"), err.rfind("failed twice")) << err;  // dropped once, after attempt 1
    EXPECT_LT(err.find("restart 1 of 3"), err.find("failed twice")) << err;
  }
}

TEST(Launcher, KeepsRestartingAtTheMinimum) {
  test::TempDir dir;
  const std::string script = in_dir("echo $TORCHELASTIC_RESTART_COUNT $WORLD_SIZE >> @D/attempts; exit 3", dir);
  LaunchOptions o = sh_options(script, 1);
  o.max_restarts = 3;
  EXPECT_EQ(run_launcher(o, dir), 3);
  EXPECT_EQ(read_text(dir.file("attempts")), "0 1\n1 1\n2 1\n3 1\n");
  EXPECT_EQ(read_text(dir.file("launcher.err")).find("failed twice"), std::string::npos);
}

TEST(Launcher, PutsBackTheSignalHandlersItFound) {
  struct sigaction custom {
  }, ignore{}, saved_int{}, saved_hup{};
  custom.sa_handler = [](int) {};
  sigemptyset(&custom.sa_mask);
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGINT, &custom, &saved_int);
  sigaction(SIGHUP, &ignore, &saved_hup);
  struct sigaction before_term {};
  sigaction(SIGTERM, nullptr, &before_term);

  EXPECT_EQ(launch(sh_options("exit 0", 1)), 0);
  struct sigaction after {};
  sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, custom.sa_handler);
  sigaction(SIGHUP, nullptr, &after);
  EXPECT_EQ(after.sa_handler, SIG_IGN);
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before_term.sa_handler);
  sigaction(SIGINT, &saved_int, nullptr);
  sigaction(SIGHUP, &saved_hup, nullptr);
}

TEST(Launcher, ParsesAWorkerCountOrARange) {
  LaunchOptions o;
  parse_nproc("4", o);
  EXPECT_EQ(o.min_procs, 4);
  EXPECT_EQ(o.max_procs, 4);
  parse_nproc("2:4", o);
  EXPECT_EQ(o.min_procs, 2);
  EXPECT_EQ(o.max_procs, 4);
  for (const std::string bad : {"0", "4:2", "x", "1:", ":3", "", "-1", " 4", "1:2:3", "0:2", "99999999"}) {
    LaunchOptions p;
    const std::string message = test::error_of([&] { parse_nproc(bad, p); });
    EXPECT_NE(message.find("--nproc-per-node '" + bad + "'"), std::string::npos) << "'" << bad << "': " << message;
    EXPECT_NE(message.find("MIN:MAX"), std::string::npos) << message;
  }
}

TEST(Launcher, RefusesBadOptionsNamingTheOption) {
  const auto refused = [](void (*edit)(LaunchOptions&)) {
    LaunchOptions o = sh_options("exit 0", 2);
    edit(o);
    return test::error_of([&] { launch(o); });
  };
  EXPECT_NE(refused([](LaunchOptions& o) { o.command.clear(); }).find("after `--`"), std::string::npos);
  EXPECT_NE(refused([](LaunchOptions& o) { o.min_procs = o.max_procs = 0; }).find("--nproc-per-node"),
            std::string::npos);
  EXPECT_NE(refused([](LaunchOptions& o) { o.min_procs = 3; }).find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(refused([](LaunchOptions& o) {
              o.nnodes = 2;
              o.node_rank = 2;
            }).find("--node-rank 2"),
            std::string::npos);
  EXPECT_NE(refused([](LaunchOptions& o) { o.node_rank = -1; }).find("--node-rank"), std::string::npos);
  EXPECT_NE(refused([](LaunchOptions& o) { o.master_port = 0; }).find("--master-port 0"), std::string::npos);
  EXPECT_NE(refused([](LaunchOptions& o) { o.master_port = 70000; }).find("--master-port 70000"), std::string::npos);
  EXPECT_NE(refused([](LaunchOptions& o) {
              o.nnodes = 2;
              o.min_procs = 1;
            }).find("--nnodes 1"),
            std::string::npos);
  EXPECT_NE(refused([](LaunchOptions& o) { o.max_restarts = -1; }).find("--max-restarts"), std::string::npos);
}

}  // namespace
}  // namespace tandem
