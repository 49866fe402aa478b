#include "tandem/cli/launch_command.h"

#include <CLI/CLI.hpp>

namespace tandem {

LaunchCommand::LaunchCommand(CLI::App& app) {
  auto* c = command_ = app.add_subcommand(
      "launch",
      "start worker processes with torchrun's environment, pass their output on by rank, restart them on failure: "
      "tandem launch --nproc-per-node 2 -- tandem train ...");
  auto& o = options_;
  c->add_option("--nproc-per-node", nproc_,
                "workers on this node: N, or MIN:MAX (a slot failing twice in a row is dropped, down to MIN)");
  c->add_option("--nnodes", o.nnodes, "nodes in the run (one launcher per node)");
  c->add_option("--node-rank", o.node_rank, "this node's index, 0 .. nnodes-1");
  c->add_option("--master-addr", o.master_addr, "host of rank 0 (the rendezvous store)");
  c->add_option("--master-port", o.master_port, "port of the rendezvous store");
  c->add_option("--max-restarts", o.max_restarts,
                "restart every worker this many times after a failure (with --resume auto they continue from the "
                "newest intact checkpoint)");
  c->add_option("--stop-grace", o.stop_grace_s, "seconds between SIGTERM and SIGKILL when stopping");
  c->add_flag("--no-prefix", no_prefix_, "pass worker output on without the [rank N] prefix");
  c->add_option("command", o.command, "the worker command, after --")->required()->expected(-1);
}

bool LaunchCommand::chosen() const { return command_->parsed(); }

int LaunchCommand::run() {
  parse_nproc(nproc_, options_);
  options_.prefix_output = !no_prefix_;
  return launch(options_);
}

}  // namespace tandem
