#pragma once
// `tandem bench bk_core`: the BK-core kernels against the same sweeps in LibTorch ops, against
// cuSPARSE's batched tridiagonal solver and against the device's memory-bandwidth floor, forward and forward+backward, over a grid of B and N.

#include <torch/torch.h>

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
  int64_t cusparse_max_elements = int64_t(1) << 27;  ///< cuSPARSE runs where B*N*N <= this (O(B N^2) memory)
  std::string json_path;
};

/// Runs the grid, prints a table, appends JSON lines; returns 0.
int run_bk_core_bench(const BkCoreBenchOptions& options);

namespace detail {
/// diag((H - zI)^-1) in complex128 by cuSPARSE's batched tridiagonal solver (gtsv2StridedBatch),
/// one system per batch row and column; registered by the CUDA build, null without it.
using BkCoreCusparseFn = torch::Tensor (*)(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                                           const torch::Tensor& z);
BkCoreCusparseFn& bk_core_cusparse();
}  // namespace detail

}  // namespace tandem
