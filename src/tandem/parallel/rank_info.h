#pragma once
// Who this process is in a multi-process run, read from the environment a launcher leaves: the
// torchrun contract (also `tandem launch`'s), SLURM's or Open MPI's (Note [Rank discovery]).
// Torch-free, so the launcher and the tests use it without LibTorch.

#include <functional>
#include <optional>
#include <string>

namespace tandem {

/// One process's place in the run.
struct RankInfo {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;                  ///< TORCHELASTIC_RESTART_COUNT: how many times the launcher restarted the run
  int max_restarts = -1;                  ///< TORCHELASTIC_MAX_RESTARTS; -1 = not under a restarting launcher
  int device_index = -1;                  ///< TANDEM_DEVICE_INDEX (a launcher's device slot); -1 = local_rank
  std::string source = "single process";  ///< "torchrun", "SLURM", "Open MPI" or "single process"

  bool distributed() const { return world_size > 1; }
  /// The GPU this rank trains on: the launcher's slot, else the local rank.
  int gpu() const { return device_index >= 0 ? device_index : local_rank; }
  /// Whether the launcher will restart the run after this attempt fails.
  bool restart_left() const { return max_restarts > restart_count; }
};

/// Reads a variable; the default reads the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// The rank from the first contract present (torchrun, then SLURM, then Open MPI); a single process
/// when none is. UserError naming the variable and the fix when one is present but incomplete or
/// out of range.
RankInfo discover_rank(const EnvLookup& env = {});

/// How a run goes on after a rank stopped: the launcher's restart while restarts remain, else
/// `--resume auto` by hand (`run_dir` "" when not known yet) (Note [Peer loss]).
std::string how_the_run_continues(const RankInfo& ranks, const std::string& run_dir);

/// The first host of a SLURM node list: "node[03-05,9],gpu1" -> "node03"; "a,b" -> "a".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace tandem
