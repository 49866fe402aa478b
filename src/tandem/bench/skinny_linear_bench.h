#pragma once
// `tandem bench skinny_linear`: the skinny linear (Note [Skinny linear]) against cuBLAS's product
// (LibTorch's linear) on a decode step's shapes, each product's weights read from memory (copies
// enough to spill the GPU's L2), launched from a CUDA graph as a recorded decode step launches
// them; time a product and the weight-read bandwidth it reached.

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct SkinnyLinearBenchOptions {
  /// Weight shapes "OxK" (outputs x inputs); empty: the products of a Llama layer of the 1B folder
  /// the serving benchmarks use (width 2048) and of Llama-2-7B (width 4096).
  std::vector<std::string> shapes;
  int64_t rows = 1;       ///< rows of x, 1 to 4 (the batch of a decode step)
  int repeats = 20;       ///< timed replays per measurement (median reported)
  std::string json_path;  ///< one JSON object per shape, appended
};

/// Runs the benchmark on CUDA device 0, prints one line per shape; returns 0, or throws (bad input,
/// no CUDA device).
int run_skinny_linear_bench(const SkinnyLinearBenchOptions& options);

}  // namespace tandem
