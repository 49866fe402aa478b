#include "tandem/parallel/rank_info.h"

#include <cstdlib>

#include "tandem/core/error.h"

namespace tandem {

// Note [Rank discovery]
// torchrun's contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT) is the one `tandem launch` writes, so a worker runs unchanged under
// either. Under srun, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID give the rank and the first host of
// SLURM_NODELIST is the master (MASTER_ADDR and MASTER_PORT still override). Under mpirun, Open
// MPI's OMPI_COMM_WORLD_* give the rank; MASTER_ADDR must name rank 0's host unless every rank is
// on one node. The rendezvous itself is c10d's TCPStore on MASTER_ADDR:MASTER_PORT (parallel/comm.h).

namespace {

int to_int(const EnvLookup& env, const std::string& name, int fallback, bool required) {
  const auto v = env(name);
  if (!v || v->empty()) {
    TANDEM_CHECK(!required, name,
                 " is not set; a launcher (tandem launch, torchrun, srun, mpirun) sets it, or set it "
                 "by hand for every process");
    return fallback;
  }
  char* end = nullptr;
  const long x = std::strtol(v->c_str(), &end, 10);
  TANDEM_CHECK(end != v->c_str() && *end == '\0' && x >= 0 && x <= 1 << 24, name, "='", *v,
               "' is not a non-negative integer; fix the launcher's environment");
  return static_cast<int>(x);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  size_t depth = 0, end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    if (nodelist[i] == ']' && depth > 0) --depth;
    if (nodelist[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  const std::string first = nodelist.substr(0, end);
  const size_t open = first.find('[');
  if (open == std::string::npos) return first;
  // "prefix[03-05,9]suffix": the first number of the range list, with its zero padding.
  const size_t close = first.find(']', open);
  TANDEM_CHECK(close != std::string::npos, "SLURM_NODELIST='", nodelist, "' has an unclosed '['");
  std::string range = first.substr(open + 1, close - open - 1);
  range = range.substr(0, range.find_first_of(",-"));
  return first.substr(0, open) + range + first.substr(close + 1);
}

RankInfo discover_rank(const EnvLookup& lookup) {
  const EnvLookup env = lookup ? lookup : [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  RankInfo r;
  const auto has = [&](const char* name) { return env(name).has_value(); };
  if (has("RANK") || has("WORLD_SIZE")) {
    r.source = "torchrun";
    r.rank = to_int(env, "RANK", 0, true);
    r.world_size = to_int(env, "WORLD_SIZE", 1, true);
    r.local_rank = to_int(env, "LOCAL_RANK", r.rank, false);
    r.local_world_size = to_int(env, "LOCAL_WORLD_SIZE", r.world_size, false);
  } else if (has("SLURM_PROCID") && has("SLURM_NTASKS")) {
    r.source = "SLURM";
    r.rank = to_int(env, "SLURM_PROCID", 0, true);
    r.world_size = to_int(env, "SLURM_NTASKS", 1, true);
    r.local_rank = to_int(env, "SLURM_LOCALID", 0, false);
    // SLURM_NTASKS_PER_NODE may read "4(x2)": its leading number.
    const auto per_node = env("SLURM_NTASKS_PER_NODE");
    r.local_world_size = per_node ? std::atoi(per_node->c_str()) : r.world_size;
    if (r.local_world_size <= 0) r.local_world_size = r.world_size;
    if (const auto nodes = env("SLURM_NODELIST"); nodes && !nodes->empty()) r.master_addr = first_slurm_host(*nodes);
  } else if (has("OMPI_COMM_WORLD_RANK")) {
    r.source = "Open MPI";
    r.rank = to_int(env, "OMPI_COMM_WORLD_RANK", 0, true);
    r.world_size = to_int(env, "OMPI_COMM_WORLD_SIZE", 1, true);
    r.local_rank = to_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, false);
    r.local_world_size = to_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", r.world_size, false);
  } else {
    return r;
  }
  if (const auto a = env("MASTER_ADDR"); a && !a->empty()) r.master_addr = *a;
  r.master_port = to_int(env, "MASTER_PORT", r.master_port, false);
  r.restart_count = to_int(env, "TORCHELASTIC_RESTART_COUNT", 0, false);
  r.max_restarts = to_int(env, "TORCHELASTIC_MAX_RESTARTS", -1, false);
  r.device_index = to_int(env, "TANDEM_DEVICE_INDEX", -1, false);
  TANDEM_CHECK(r.world_size >= 1 && r.rank < r.world_size, r.source, ": rank ", r.rank, " is not below the world size ",
               r.world_size, "; every process of a run must see the same world size");
  TANDEM_CHECK(r.local_world_size >= 1 && r.local_rank < r.local_world_size, r.source, ": local rank ", r.local_rank,
               " is not below the local world size ", r.local_world_size);
  TANDEM_CHECK(r.master_port > 0 && r.master_port < 65536, "MASTER_PORT=", r.master_port,
               " is not a TCP port; choose one in 1024..65535");
  return r;
}

std::string how_the_run_continues(const RankInfo& ranks, const std::string& run_dir) {
  if (ranks.restart_left()) return "the launcher restarts the run from the newest checkpoint";
  return "continue from the newest checkpoint with --resume auto --run-dir " +
         (run_dir.empty() ? std::string("<the run directory>") : run_dir) +
         " (tandem launch --max-restarts N restarts by itself)";
}

}  // namespace tandem
