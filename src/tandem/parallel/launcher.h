#pragma once
// `tandem launch`: starts one worker process per local slot with torchrun's environment,
// passes their output on line by line, forwards signals, stops and restarts them
// (Note [Launcher] in launcher.cpp). Plain POSIX, no LibTorch.

#include <string>
#include <vector>

namespace tandem {

/// What `tandem launch` starts and how it supervises it.
struct LaunchOptions {
  int min_procs = 1, max_procs = 1;       // --nproc-per-node N or MIN:MAX: workers on this node
  int nnodes = 1, node_rank = 0;          // --nnodes, --node-rank
  std::string master_addr = "127.0.0.1";  // --master-addr: rank 0's host, passed on as MASTER_ADDR
  int master_port = 29500;                // --master-port, passed on as MASTER_PORT
  int max_restarts = 0;                   // --max-restarts: new attempts after a failed one
  double stop_grace_s = 30;               // SIGTERM -> SIGKILL after this, when stopping after a failure
  double restart_delay_s = 1;             // pause between a stopped attempt and the next (ports get free)
  bool prefix_output = true;              // "[rank N] " before each line a worker writes
  std::vector<std::string> command;       // argv of the worker (after `--`); argv[0] is looked up in PATH
};

/// Parses --nproc-per-node's text, "N" or "MIN:MAX" (1 <= MIN <= MAX), into o.min_procs and
/// o.max_procs; throws UserError naming the option and the fix on any other text.
void parse_nproc(const std::string& text, LaunchOptions& o);

/// Starts the workers, supervises them and restarts them as Note [Launcher] says; returns the
/// launcher's exit code: 0 when every worker exited 0, else the failed worker's code (128 + s for
/// a worker killed by signal s). Throws UserError on bad options or when no process can be
/// started. One launch() at a time per process (it owns SIGINT, SIGTERM, SIGHUP and SIGCHLD while
/// it runs and puts the previous handlers back before it returns).
int launch(const LaunchOptions& o);

}  // namespace tandem
