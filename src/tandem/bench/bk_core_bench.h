#pragma once
// `tandem bench bk_core`: the BK-core kernels against the same sweeps in LibTorch ops and against
// the device's memory-bandwidth floor, forward and forward+backward, over a grid of B and N.

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct BkCoreBenchOptions {
  std::vector<int64_t> batches = {1, 32, 256};
  std::vector<int64_t> lengths = {1024, 4096, 65536, 1000000};
  std::string device = "auto";  ///< auto | cpu | cuda
  int repeats = 5;
  int64_t ops_max_elements = int64_t(1) << 17;  ///< the LibTorch-ops baseline runs where B*N <= this
  std::string json_path;
};

/// Runs the grid, prints a table, appends JSON lines; returns 0.
int run_bk_core_bench(const BkCoreBenchOptions& options);

}  // namespace tandem
