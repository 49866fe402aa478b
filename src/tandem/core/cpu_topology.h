#pragma once
// The host's cores divided among the ranks that share it (Note [Core division]).

#include <string>
#include <vector>

namespace tandem {

/// This local rank's share of the CPUs the process may run on: whole physical cores (with their
/// hardware threads) in hwloc's topology order, so a share stays within one NUMA node where the
/// counts allow; without hwloc, an even split of the allowed CPUs in number order. Empty when there
/// are fewer cores than ranks. `how` (optional) receives one line saying what was chosen.
std::vector<int> rank_cpus(int local_rank, int local_world, std::string* how = nullptr);

}  // namespace tandem
