#include "tandem/core/cpu_topology.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/core/thread_pool.h"

#ifdef TANDEM_WITH_HWLOC
#include <hwloc.h>
#endif

namespace tandem {

// Note [Core division]
// The ranks of one host must not run their CPU updates on the same cores. Each takes
// floor(cores / ranks) whole physical cores in topology order (hwloc numbers cores logically,
// NUMA node by NUMA node), with every hardware thread of those cores, so neighbouring ranks get
// neighbouring cores and, when the counts divide, a rank's cores share one NUMA node (one memory
// controller for its pinned buffers). hwloc sees only the CPUs this process may run on (the
// launcher's or the batch system's mask). Without hwloc the allowed CPU numbers are split evenly.
// The trainer binds the process to its share before any thread starts (Note [Data parallel]).

std::vector<int> rank_cpus(int local_rank, int local_world, std::string* how) {
  TANDEM_ASSERT(local_world >= 1 && local_rank >= 0 && local_rank < local_world, "local rank ", local_rank, " of ",
                local_world);
#ifdef TANDEM_WITH_HWLOC
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) == 0) {
    std::vector<std::vector<int>> cores;  // per core (logical order): its allowed PUs
    std::vector<int> numa;                // per core: its NUMA node's logical index, or -1
    if (hwloc_topology_load(topo) == 0) {
      const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
      for (int c = 0; c < n; ++c) {
        hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(c));
        std::vector<int> pus;
        unsigned pu = 0;
        hwloc_bitmap_foreach_begin(pu, core->cpuset) { pus.push_back(static_cast<int>(pu)); }
        hwloc_bitmap_foreach_end();
        if (pus.empty()) continue;
        hwloc_obj_t mem = nullptr;
        if (core->cpuset != nullptr) {
          // The NUMA node whose CPUs include this core.
          for (int m = 0; m < hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE); ++m) {
            hwloc_obj_t cand = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(m));
            if (cand->cpuset != nullptr && hwloc_bitmap_isincluded(core->cpuset, cand->cpuset)) {
              mem = cand;
              break;
            }
          }
        }
        cores.push_back(std::move(pus));
        numa.push_back(mem != nullptr ? static_cast<int>(mem->logical_index) : -1);
      }
    }
    hwloc_topology_destroy(topo);
    const size_t per = cores.size() / static_cast<size_t>(local_world);
    if (per >= 1) {
      std::vector<int> out;
      std::vector<int> nodes;
      for (size_t c = per * static_cast<size_t>(local_rank); c < per * static_cast<size_t>(local_rank + 1); ++c) {
        out.insert(out.end(), cores[c].begin(), cores[c].end());
        if (std::find(nodes.begin(), nodes.end(), numa[c]) == nodes.end()) nodes.push_back(numa[c]);
      }
      std::sort(out.begin(), out.end());
      if (how != nullptr) {
        std::string ns;
        for (const int x : nodes) ns += (ns.empty() ? "" : ",") + std::to_string(x);
        *how = strprintf("%zu of %zu cores (%zu CPUs) on NUMA node %s (hwloc)", per, cores.size(), out.size(), ns.c_str());
      }
      return out;
    }
  }
#endif
  const std::vector<int> cpus = allowed_cpus();
  const size_t per = cpus.size() / static_cast<size_t>(local_world);
  if (per == 0) return {};
  std::vector<int> out(cpus.begin() + static_cast<std::ptrdiff_t>(per * local_rank),
                       cpus.begin() + static_cast<std::ptrdiff_t>(per * (local_rank + 1)));
  if (how != nullptr) *how = strprintf("%zu of %zu CPUs (no hwloc: in number order)", per, cpus.size());
  return out;
}

}  // namespace tandem
