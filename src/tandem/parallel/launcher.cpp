#include "tandem/parallel/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

extern char** environ;

namespace tandem {

// Note [Launcher]
// `tandem launch` keeps torchrun's contract in plain POSIX. Each attempt forks one worker per
// local slot and execs the command in its own process group (so a signal reaches the worker and
// everything it started) with stdin from /dev/null, and the environment of torch.distributed:
// RANK = node_rank * n + local rank, LOCAL_RANK, WORLD_SIZE = nnodes * n, LOCAL_WORLD_SIZE = n,
// GROUP_RANK = NODE_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT (the attempt, 0
// first), TORCHELASTIC_MAX_RESTARTS, plus TANDEM_LAUNCHED=1, TANDEM_DEVICE_INDEX (the slot) and,
// unless the launcher's environment sets them, OMP_NUM_THREADS = allowed cores / n and
// TORCH_CPP_LOG_LEVEL=ERROR (LibTorch's warnings come with stack frames). The workers'
// stdout and stderr come back through pipes and go out whole lines at a time, "[rank R] " first.
// One poll() loop watches the pipes and a self-pipe that the signal handlers write to.
//  - Every worker exits 0: the launcher exits 0.
//  - SIGINT, SIGTERM or SIGHUP from outside is passed on to every worker (a second one: SIGKILL);
//    there is no restart, and the launcher exits 0 when every worker did, else with the first
//    failure's code.
//  - A worker fails on its own (exit code c, or signal s, counted as 128 + s): the others get
//    SIGTERM, and SIGKILL after stop_grace_s. While restarts remain, the next attempt starts
//    restart_delay_s later (ports get free); otherwise the launcher exits with that worker's code.
//  - Degradation (--nproc-per-node MIN:MAX): the slots are the device indices 0..MAX-1. A slot
//    whose worker failed on its own (not stopped by the launcher) in two consecutive attempts is
//    dropped and the next attempt runs one worker fewer, so a broken GPU is not used again; never
//    fewer than MIN (at MIN the launcher just restarts). Local ranks are renumbered over the
//    remaining slots. Each node would drop slots on its own, so a range needs --nnodes 1.

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
constexpr int kHandledCount = sizeof(kHandledSignals) / sizeof(kHandledSignals[0]);
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxPendingLine = 1 << 20;  // a longer line without '\n' is passed on in pieces
constexpr int kBackstopPollMs = 1000;        // SIGCHLD wakes the loop; this only bounds a lost wake-up

// The keys the launcher sets; a stale value in its own environment is not passed on.
const char* const kWorkerKeys[] = {"RANK",
                                   "LOCAL_RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_WORLD_SIZE",
                                   "GROUP_RANK",
                                   "NODE_RANK",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "TORCHELASTIC_RESTART_COUNT",
                                   "TORCHELASTIC_MAX_RESTARTS",
                                   "TANDEM_LAUNCHED",
                                   "TANDEM_DEVICE_INDEX"};

void log_line(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// One line "tandem launch: ..." on stderr.
void log_line(const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  std::fprintf(stderr, "tandem launch: %s\n", text);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

/// `s` seconds as a clock duration; capped at a year, so a huge option cannot overflow it.
Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(s, 365 * 86400.0)));
}

const char* workers_word(size_t n) { return n == 1 ? "worker" : "workers"; }

// ---- signals ----

volatile sig_atomic_t g_wake_fd = -1;

void on_launcher_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_wake_fd >= 0) {
    [[maybe_unused]] const auto n = ::write(g_wake_fd, &byte, 1);
  }
  errno = saved;
}

/// The launcher's handlers for SIGINT, SIGTERM, SIGHUP and SIGCHLD: each writes its signal's
/// number into a pipe that the poll loop watches (the self-pipe trick). A signal the launcher was
/// started ignoring (nohup) stays ignored. The destructor puts the previous handlers back.
class SignalPipe {
 public:
  SignalPipe() {
    TANDEM_ASSERT(g_wake_fd < 0, "one launch() at a time per process");
    int fds[2];
    TANDEM_CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0,
                 "tandem launch: cannot make a pipe: ", std::strerror(errno));
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    g_wake_fd = write_fd_;
    struct sigaction sa {};
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (int i = 0; i < kHandledCount; ++i) {
      ::sigaction(kHandledSignals[i], nullptr, &previous_[i]);
      if (kHandledSignals[i] != SIGCHLD && previous_[i].sa_handler == SIG_IGN) continue;
      ::sigaction(kHandledSignals[i], &sa, nullptr);
    }
  }
  ~SignalPipe() {
    for (int i = 0; i < kHandledCount; ++i) ::sigaction(kHandledSignals[i], &previous_[i], nullptr);
    g_wake_fd = -1;
    ::close(read_fd_);
    ::close(write_fd_);
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_fd_; }

  /// The signals received since the last call, in order; SIGCHLD (a wake-up only) left out.
  std::vector<int> take() {
    std::vector<int> sigs;
    unsigned char bytes[64];
    for (;;) {
      const ssize_t n = ::read(read_fd_, bytes, sizeof bytes);
      if (n <= 0) break;
      for (ssize_t i = 0; i < n; ++i)
        if (bytes[i] != SIGCHLD) sigs.push_back(bytes[i]);
    }
    return sigs;
  }

  /// Waits up to timeout_s for a forwarded signal; returns it, or 0 when none came.
  int wait(double timeout_s) {
    const auto deadline = Clock::now() + seconds(timeout_s);
    for (;;) {
      const std::vector<int> sigs = take();
      if (!sigs.empty()) return sigs.front();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return 0;
      pollfd p{read_fd_, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<long long>(left, kBackstopPollMs)));
    }
  }

  /// The disposition a worker starts with for handled signal i: ignored if the launcher's was.
  bool ignored_before(int i) const { return previous_[i].sa_handler == SIG_IGN; }

 private:
  int read_fd_ = -1, write_fd_ = -1;
  struct sigaction previous_[kHandledCount] {};
};

// ---- worker output ----

/// One of a worker's output streams on its way to the launcher's stdout or stderr.
struct OutputStream {
  int fd = -1;          // read end of the pipe; -1 once closed
  int target_fd = 1;    // the launcher's stdout (1) or stderr (2)
  std::string pending;  // bytes after the last '\n'
};

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // a non-blocking stdout that is full
        pollfd q{fd, POLLOUT, 0};
        ::poll(&q, 1, kBackstopPollMs);
        continue;
      }
      return;  // the launcher's output is gone; the workers go on
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

/// Writes the complete lines of s.pending, each after `prefix`, in one write; at EOF also the
/// final partial line, with a '\n' added so the next line starts on its own.
void pass_on_lines(OutputStream& s, const std::string& prefix, bool at_eof) {
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    out += prefix;
    out.append(s.pending, start, nl + 1 - start);
  }
  s.pending.erase(0, start);
  if (!s.pending.empty() && (at_eof || s.pending.size() > kMaxPendingLine)) {
    out += prefix;
    out += s.pending;
    out += '\n';
    s.pending.clear();
  }
  if (!out.empty()) write_all(s.target_fd, out.data(), out.size());
}

/// Reads once from s; returns false at EOF (then the stream is flushed and closed).
bool read_stream(OutputStream& s, const std::string& prefix) {
  char buf[kReadChunk];
  const ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    pass_on_lines(s, prefix, /*at_eof=*/true);
    ::close(s.fd);
    s.fd = -1;
    return false;
  }
  s.pending.append(buf, static_cast<size_t>(n));
  pass_on_lines(s, prefix, /*at_eof=*/false);
  return true;
}

// ---- workers ----

struct Worker {
  int local_rank = 0, slot = 0;
  long long rank = 0;
  pid_t pid = -1;  // also its process group
  bool running = false;
  bool signalled = false;  // the launcher sent it a signal (a stop or a forwarded one)
  int code = 0;            // exit code; 128 + s when killed by signal s
  int term_signal = 0;     // s, or 0 when it exited
  std::string prefix;
  OutputStream out, err;
};

/// How an attempt ended.
constexpr int kExitRefusedInput = 2;  // tandem's exit code for bad input (cli/main.cpp)

struct AttemptEnd {
  int code = 0;                    // 0 when every worker exited 0, else the first failure's code
  bool stopped_by_signal = false;  // a signal from outside was passed on: no restart
  std::vector<int> failed_slots;   // slots whose worker failed on its own
};

/// What every worker of a launch shares: the argv, the environment without the keys the launcher
/// sets, and the exec-failure message's start.
struct WorkerTemplate {
  std::vector<std::string> base_env;
  bool set_omp_threads = false;
  std::vector<char*> argv;
  std::string exec_failure;  // "tandem launch: cannot run <cmd>: "
};

WorkerTemplate make_template(const LaunchOptions& o) {
  WorkerTemplate t;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    const bool ours =
        std::any_of(std::begin(kWorkerKeys), std::end(kWorkerKeys), [&](const char* k) { return key == k; });
    if (!ours) t.base_env.push_back(entry);
  }
  t.set_omp_threads = std::getenv("OMP_NUM_THREADS") == nullptr;
  // LibTorch's own C++ warnings carry their stack frames (a store connection closing as a peer
  // stops prints a dozen lines beside tandem's one): errors only, unless the environment says.
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) t.base_env.emplace_back("TORCH_CPP_LOG_LEVEL=ERROR");
  for (const std::string& a : o.command) t.argv.push_back(const_cast<char*>(a.c_str()));
  t.argv.push_back(nullptr);
  t.exec_failure = "tandem launch: cannot run " + o.command[0] + ": ";
  return t;
}

/// dup2 that also works when fd already is target (dup2 would leave FD_CLOEXEC set).
void move_fd(int fd, int target) {
  if (fd != target) {
    ::dup2(fd, target);
  } else {
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0) ::fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
  }
}

/// The forked child: becomes its own process group, takes the pipes as stdout and stderr and
/// execs the command. Async-signal-safe calls only, strerror aside (the parent may have other
/// threads, whose locks the child inherits held).
[[noreturn]] void exec_worker(const WorkerTemplate& t, const SignalPipe& signals, const sigset_t& old_mask, char** envp,
                              int out_fd, int err_fd) {
  ::setpgid(0, 0);
  for (int i = 0; i < kHandledCount; ++i) {
    struct sigaction sa {};
    sa.sa_handler = signals.ignored_before(i) ? SIG_IGN : SIG_DFL;
    sigemptyset(&sa.sa_mask);
    ::sigaction(kHandledSignals[i], &sa, nullptr);
  }
  move_fd(out_fd, 1);
  move_fd(err_fd, 2);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) {
    move_fd(null_fd, 0);
    if (null_fd > 2) ::close(null_fd);
  }
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  environ = envp;
  ::execvp(t.argv[0], t.argv.data());
  const char* reason = std::strerror(errno);
  [[maybe_unused]] auto n1 = ::write(2, t.exec_failure.data(), t.exec_failure.size());
  [[maybe_unused]] auto n2 = ::write(2, reason, std::strlen(reason));
  [[maybe_unused]] auto n3 = ::write(2, "\n", 1);
  ::_exit(127);
}

/// The workers of one attempt. The destructor kills and reaps any still running (an exception
/// must not leave workers behind) and closes the pipes.
class WorkerGroup {
 public:
  WorkerGroup(const LaunchOptions& o, const WorkerTemplate& t, SignalPipe& signals)
      : options_(o), template_(t), signals_(signals) {}
  ~WorkerGroup() {
    for (Worker& w : workers_) {
      if (w.running) {
        signal_worker(w, SIGKILL);
        int status = 0;
        while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
        }
      }
      for (OutputStream* s : {&w.out, &w.err})
        if (s->fd >= 0) ::close(s->fd);
    }
  }
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  /// Forks and execs one worker per slot for attempt `attempt`.
  void start(const std::vector<int>& slots, int attempt) {
    const int n = static_cast<int>(slots.size());
    const int omp_threads = std::max(1, static_cast<int>(allowed_cpus().size()) / n);
    workers_.resize(slots.size());
    for (int local = 0; local < n; ++local) {
      Worker& w = workers_[local];
      w.local_rank = local;
      w.slot = slots[local];
      const long long rank = static_cast<long long>(options_.node_rank) * n + local;
      w.rank = rank;
      w.prefix = options_.prefix_output ? "[rank " + std::to_string(rank) + "] " : "";

      std::vector<std::string> env = template_.base_env;
      auto set = [&](const char* key, const std::string& value) { env.push_back(std::string(key) + "=" + value); };
      set("RANK", std::to_string(rank));
      set("LOCAL_RANK", std::to_string(local));
      set("WORLD_SIZE", std::to_string(static_cast<long long>(options_.nnodes) * n));
      set("LOCAL_WORLD_SIZE", std::to_string(n));
      set("GROUP_RANK", std::to_string(options_.node_rank));
      set("NODE_RANK", std::to_string(options_.node_rank));
      set("MASTER_ADDR", options_.master_addr);
      set("MASTER_PORT", std::to_string(options_.master_port));
      set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
      set("TORCHELASTIC_MAX_RESTARTS", std::to_string(options_.max_restarts));
      set("TANDEM_LAUNCHED", "1");
      set("TANDEM_DEVICE_INDEX", std::to_string(w.slot));
      if (template_.set_omp_threads) set("OMP_NUM_THREADS", std::to_string(omp_threads));
      std::vector<char*> envp;
      for (std::string& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);

      int out_pipe[2], err_pipe[2];
      TANDEM_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0, "tandem launch: cannot make a pipe for rank ", rank, ": ",
                   std::strerror(errno));
      w.out = {out_pipe[0], 1, ""};
      if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
        const int e = errno;
        ::close(out_pipe[1]);
        TANDEM_FAIL("tandem launch: cannot make a pipe for rank ", rank, ": ", std::strerror(e));
      }
      w.err = {err_pipe[0], 2, ""};

      // Blocked across fork: the child must not run the launcher's handlers before it resets them.
      sigset_t block, old_mask;
      sigemptyset(&block);
      for (int sig : kHandledSignals) sigaddset(&block, sig);
      ::pthread_sigmask(SIG_BLOCK, &block, &old_mask);
      const pid_t pid = ::fork();
      if (pid == 0) exec_worker(template_, signals_, old_mask, envp.data(), out_pipe[1], err_pipe[1]);
      const int fork_errno = errno;
      ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      TANDEM_CHECK(pid > 0, "tandem launch: cannot start rank ", rank, ": fork: ", std::strerror(fork_errno));
      ::setpgid(pid, pid);  // also in the child: whichever runs first, the group exists before a kill
      w.pid = pid;
      w.running = true;
      for (OutputStream* s : {&w.out, &w.err}) ::fcntl(s->fd, F_SETFL, ::fcntl(s->fd, F_GETFL) | O_NONBLOCK);
    }
  }

  /// Supervises the attempt until every worker has exited (Note [Launcher]).
  AttemptEnd supervise() {
    AttemptEnd end;
    bool stopping = false, killed = false;
    Clock::time_point kill_at{};
    for (;;) {
      const Worker* first_failure = reap(end);
      if (first_failure != nullptr && !stopping && !end.stopped_by_signal) {
        const size_t others = running_count();
        std::string what = first_failure->term_signal != 0
                               ? "was killed by signal " + std::to_string(first_failure->term_signal) + " (" +
                                     signal_name(first_failure->term_signal) + ")"
                               : "exited with code " + std::to_string(first_failure->code);
        if (others > 0) what += "; stopping the other " + std::to_string(others) + " " + workers_word(others);
        log_line("rank %lld %s", first_failure->rank, what.c_str());
        signal_all(SIGTERM);
        stopping = true;
        kill_at = Clock::now() + seconds(options_.stop_grace_s);
      }
      if (running_count() == 0) break;

      int timeout_ms = kBackstopPollMs;
      if (stopping && !killed) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, kBackstopPollMs));
      }
      std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
      std::vector<std::pair<OutputStream*, const std::string*>> streams;  // with their worker's prefix
      for (Worker& w : workers_)
        for (OutputStream* s : {&w.out, &w.err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            streams.push_back({s, &w.prefix});
          }
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR)
        TANDEM_FAIL("tandem launch: poll failed: ", std::strerror(errno));

      for (int sig : signals_.take()) {
        if (!end.stopped_by_signal) {
          end.stopped_by_signal = true;
          const size_t n = running_count();
          log_line("got %s; passing it on to %zu %s (a second signal kills them)", signal_name(sig), n,
                   workers_word(n));
          signal_all(sig);
        } else if (!killed) {
          log_line("got %s again; killing the workers", signal_name(sig));
          signal_all(SIGKILL);
          killed = true;
        }
      }
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents != 0) read_stream(*streams[i - 1].first, *streams[i - 1].second);
      if (stopping && !killed && Clock::now() >= kill_at && running_count() > 0) {
        const size_t n = running_count();
        log_line("%zu %s still running %gs after SIGTERM; killing them", n, workers_word(n), options_.stop_grace_s);
        signal_all(SIGKILL);
        killed = true;
      }
    }
    drain();
    return end;
  }

 private:
  size_t running_count() const {
    return static_cast<size_t>(
        std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
  }

  void signal_worker(Worker& w, int sig) {
    w.signalled = true;
    if (::kill(-w.pid, sig) != 0) ::kill(w.pid, sig);
  }

  void signal_all(int sig) {
    for (Worker& w : workers_)
      if (w.running) signal_worker(w, sig);
  }

  /// Reaps the workers that have exited; records the first failure in `end` and returns that
  /// worker when it is new in this call.
  const Worker* reap(AttemptEnd& end) {
    const Worker* first_failure = nullptr;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      w.running = false;
      if (r < 0) {
        w.code = 1;  // not ours to reap any more (someone set SIGCHLD to SIG_IGN): counted as failed
      } else if (WIFSIGNALED(status)) {
        w.term_signal = WTERMSIG(status);
        w.code = 128 + w.term_signal;
      } else {
        w.code = WEXITSTATUS(status);
      }
      if (w.code == 0) continue;
      if (!w.signalled) end.failed_slots.push_back(w.slot);
      if (end.code == 0) {
        end.code = w.code;
        first_failure = &w;
      }
    }
    return first_failure;
  }

  /// After the last worker exited: what is still in the pipes (bounded, in case a descendant
  /// still holds one open and writes on), then the final partial lines.
  void drain() {
    for (Worker& w : workers_)
      for (OutputStream* s : {&w.out, &w.err}) {
        for (int reads = 0; s->fd >= 0 && reads < 1024; ++reads) {
          pollfd p{s->fd, POLLIN, 0};
          if (::poll(&p, 1, 0) <= 0) break;
          read_stream(*s, w.prefix);
        }
        if (s->fd >= 0) {
          pass_on_lines(*s, w.prefix, /*at_eof=*/true);
          ::close(s->fd);
          s->fd = -1;
        }
      }
  }

  const LaunchOptions& options_;
  const WorkerTemplate& template_;
  SignalPipe& signals_;
  std::vector<Worker> workers_;
};

AttemptEnd run_attempt(const LaunchOptions& o, const WorkerTemplate& t, SignalPipe& signals,
                       const std::vector<int>& slots, int attempt) {
  WorkerGroup group(o, t, signals);
  group.start(slots, attempt);
  return group.supervise();
}

/// A decimal count of at most 6 digits, or -1.
int parse_count(const std::string& text) {
  if (text.empty() || text.size() > 6) return -1;
  for (char c : text)
    if (c < '0' || c > '9') return -1;
  return std::stoi(text);
}

void check_options(const LaunchOptions& o) {
  TANDEM_CHECK(!o.command.empty() && !o.command[0].empty(),
               "tandem launch: no worker command; write it after `--`, e.g. tandem launch --nproc-per-node 2 -- "
               "tandem train run.toml");
  TANDEM_CHECK(o.min_procs >= 1 && o.min_procs <= o.max_procs, "--nproc-per-node ", o.min_procs, ":", o.max_procs,
               ": needs 1 <= MIN <= MAX workers, e.g. 8 or 4:8");
  TANDEM_CHECK(o.nnodes >= 1, "--nnodes ", o.nnodes, ": needs at least 1 node");
  TANDEM_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank ", o.node_rank, " is outside 0..", o.nnodes - 1,
               " (--nnodes ", o.nnodes, "); number the nodes from 0");
  TANDEM_CHECK(o.min_procs == o.max_procs || o.nnodes == 1, "--nproc-per-node ", o.min_procs, ":", o.max_procs,
               " (a range) needs --nnodes 1: each node would drop slots on its own and the ranks of the nodes "
               "would no longer fit together; give one count, e.g. --nproc-per-node ",
               o.max_procs);
  TANDEM_CHECK(!o.master_addr.empty(), "--master-addr is empty; give rank 0's host name or address");
  TANDEM_CHECK(o.master_port >= 1 && o.master_port <= 65535, "--master-port ", o.master_port,
               " is outside 1..65535; pick a free TCP port, e.g. 29500");
  TANDEM_CHECK(o.max_restarts >= 0, "--max-restarts ", o.max_restarts, ": needs 0 or more");
  TANDEM_CHECK(std::isfinite(o.stop_grace_s) && o.stop_grace_s >= 0, "tandem launch: stop grace time ", o.stop_grace_s,
               " s: needs 0 or more seconds");
  TANDEM_CHECK(std::isfinite(o.restart_delay_s) && o.restart_delay_s >= 0, "tandem launch: restart delay ",
               o.restart_delay_s, " s: needs 0 or more seconds");
}

}  // namespace

void parse_nproc(const std::string& text, LaunchOptions& o) {
  const std::string usage = "; give a worker count N or a range MIN:MAX with 1 <= MIN <= MAX, e.g. 8 or 4:8";
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    const int n = parse_count(text);
    TANDEM_CHECK(n >= 1, "--nproc-per-node '", text, "' is not a worker count", usage);
    o.min_procs = o.max_procs = n;
    return;
  }
  const int lo = parse_count(text.substr(0, colon));
  const int hi = parse_count(text.substr(colon + 1));
  TANDEM_CHECK(lo >= 1 && hi >= 1, "--nproc-per-node '", text, "' is not a range of worker counts", usage);
  TANDEM_CHECK(lo <= hi, "--nproc-per-node '", text, "': MIN ", lo, " is larger than MAX ", hi, usage);
  o.min_procs = lo;
  o.max_procs = hi;
}

int launch(const LaunchOptions& o) {
  check_options(o);
  std::fflush(stdout);  // what the caller printed comes before the workers' lines
  std::fflush(stderr);
  const WorkerTemplate worker_template = make_template(o);
  SignalPipe signals;

  std::vector<int> slots(static_cast<size_t>(o.max_procs));
  for (int s = 0; s < o.max_procs; ++s) slots[s] = s;
  std::vector<int> failed_before;  // slots whose worker failed on its own in the previous attempt
  for (int attempt = 0;; ++attempt) {
    const AttemptEnd end = run_attempt(o, worker_template, signals, slots, attempt);
    if (end.code == 0 || end.stopped_by_signal) return end.code;
    // Exit code 2: a worker refused its input (a bad config, file or plan; its line says the fix).
    // The same command would be refused again, and there is nothing to resume.
    if (end.code == kExitRefusedInput) {
      log_line("a worker refused its input (exit 2): not restarted; fix what its message names and run again");
      return end.code;
    }
    if (attempt >= o.max_restarts) {
      if (o.max_restarts > 0) log_line("all %d restarts used; exiting with code %d", o.max_restarts, end.code);
      log_line(
          "to continue from the newest checkpoint, run the same command with --resume auto --run-dir DIR after "
          "`tandem train` (and --max-restarts N to restart by itself)");
      return end.code;
    }
    for (int slot : end.failed_slots) {
      const bool twice = std::find(failed_before.begin(), failed_before.end(), slot) != failed_before.end();
      if (!twice || static_cast<int>(slots.size()) <= o.min_procs) continue;
      slots.erase(std::find(slots.begin(), slots.end(), slot));
      log_line("slot %d failed twice; going on with %zu %s", slot, slots.size(), workers_word(slots.size()));
    }
    failed_before = end.failed_slots;
    log_line("restart %d of %d", attempt + 1, o.max_restarts);
    if (const int sig = signals.wait(o.restart_delay_s)) {
      log_line("got %s; not restarting", signal_name(sig));
      return end.code;
    }
  }
}

}  // namespace tandem
