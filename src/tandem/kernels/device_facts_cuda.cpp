// Per-device facts for kernel launchers, asked once per device (kernels/device_facts.h).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/device_facts.h"

namespace tandem::detail {
namespace {

constexpr int kDevices = 64;

// The current device's value of `attribute`, asked at its first use on that device (every time on
// a device past the cache's slots).
int64_t cached(std::array<std::atomic<int64_t>, kDevices>& cache, cudaDeviceAttr attribute) {
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  const bool slotted = device >= 0 && device < kDevices;
  int64_t value = slotted ? cache[static_cast<size_t>(device)].load(std::memory_order_relaxed) : 0;
  if (value <= 0) {
    int v = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&v, attribute, device));
    value = std::max(1, v);
    if (slotted) cache[static_cast<size_t>(device)].store(value, std::memory_order_relaxed);
  }
  return value;
}

}  // namespace

int multiprocessor_count() {
  static std::array<std::atomic<int64_t>, kDevices> cache{};
  return static_cast<int>(cached(cache, cudaDevAttrMultiProcessorCount));
}

int compute_capability_major() {
  static std::array<std::atomic<int64_t>, kDevices> cache{};
  return static_cast<int>(cached(cache, cudaDevAttrComputeCapabilityMajor));
}

int max_shared_per_block() {
  static std::array<std::atomic<int64_t>, kDevices> cache{};
  return static_cast<int>(cached(cache, cudaDevAttrMaxSharedMemoryPerBlockOptin));
}

}  // namespace tandem::detail
