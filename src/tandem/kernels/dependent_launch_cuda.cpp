// Whether the current device takes dependent launches (Note [Dependent launch]).

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/dependent_launch.h"

namespace tandem::detail {

bool dependent_launch_on_current_device() {
  if (!dependent_launch_allowed()) return false;
  static std::array<std::atomic<int>, 64> capable{};  // per device: 0 not asked yet, 1 no, 2 yes
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= static_cast<int>(capable.size())) return false;
  int known = capable[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    known = major >= 9 ? 2 : 1;
    capable[static_cast<size_t>(device)].store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

}  // namespace tandem::detail
