#pragma once
// `tandem bench nvme`: the NVMe tier's bound on this machine's disk (Note [NVMe tier]): what its
// files write, read, and read and write at once (the updater reads the next Block's states while
// the last one's go back), through io_uring and through pread/pwrite, on the tier's own code.

#include <cstdint>
#include <string>

namespace tandem {

struct NvmeBenchOptions {
  std::string dir;                        ///< the directory to measure (offload.nvme_path's disk)
  double gib = 4;                         ///< bytes written and read per measurement
  int64_t block_mib = 256;                ///< one transfer, a Block's states
  std::string json_path;                  ///< one JSON object per measurement, appended
};

/// Runs the benchmark, prints one line per measurement; returns 0.
int run_nvme_bench(const NvmeBenchOptions& options);

}  // namespace tandem
