#pragma once
// `tandem bench optim`: the CPU optimizer kernels against LibTorch's CPU AdamW (fused and
// foreach) and the machine's copy bandwidth, in one process, on the same buffers.

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct OptimBenchOptions {
  std::vector<int64_t> sizes = {int64_t(1) << 28, int64_t(1) << 30};  ///< parameters per run
  int repeats = 5;                ///< timed steps per variant (the median is reported)
  int warmup = 2;                 ///< untimed steps first
  int threads = 0;                ///< 0 = resolve_cpu_threads()
  bool pin = false;               ///< pin the kernel threads
  std::vector<std::string> isas;  ///< extra levels for the fp32 variant; empty = the best only
  std::string json_path;          ///< one JSON object per measurement, appended
};

/// Parses "256M", "1B", "1.5G", "1000000" (M = 2^20, B and G = 2^30, K = 2^10); UserError otherwise.
int64_t parse_param_count(const std::string& s);

/// Runs the benchmark, prints one line per measurement and a table; returns 0.
int run_optim_bench(const OptimBenchOptions& options);

}  // namespace tandem
