// The CUDA AcceleratorBackend (compiled only in CUDA builds; see Note [Build layout]).

#include <ATen/Context.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstring>

#include "tandem/core/device.h"
#include "tandem/kernels/cuda_check.h"

namespace tandem {
namespace {

class CudaBackend : public AcceleratorBackend {
 public:
  int device_count() const override {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  }
  std::string device_name(int index) const override {
    cudaDeviceProp prop{};
    TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    return prop.name;
  }
  DeviceMemoryStats memory_stats(int index) const override {
    // The caching allocator is set up lazily, at the first CUDA tensor; before that it has no
    // device entries to report.
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    DeviceMemoryStats s;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    s.allocated = stats.allocated_bytes[agg].current;
    s.peak_allocated = stats.allocated_bytes[agg].peak;
    s.reserved = stats.reserved_bytes[agg].current;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    size_t free = 0, total = 0;
    TANDEM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    s.free = static_cast<int64_t>(free);
    s.total = static_cast<int64_t>(total);
    return s;
  }
  void empty_cache(int) override { c10::cuda::CUDACachingAllocator::emptyCache(); }
  void reset_peak_memory(int index) override {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
  }
  void synchronize(int index) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::string rng_state(int index) const override {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
    auto t = gen.get_state();
    return std::string(static_cast<const char*>(t.data_ptr()), t.numel());
  }
  void set_rng_state(int index, const std::string& state) override {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
    auto t = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
    std::memcpy(t.data_ptr(), state.data(), state.size());
    gen.set_state(t);
  }
  bool host_register(void* ptr, size_t bytes) override {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    if (cudaHostRegister(ptr, bytes, cudaHostRegisterPortable) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the non-sticky error state
      return false;
    }
    return true;
  }
  void host_unregister(void* ptr) override { (void)cudaHostUnregister(ptr); }
  std::string pci_bus_id(int index) const override {
    char buf[32] = {0};
    return cudaDeviceGetPCIBusId(buf, sizeof buf, index) == cudaSuccess ? std::string(buf) : std::string();
  }
};

const bool kRegistered = [] {
  register_accelerator(std::make_unique<CudaBackend>());
  return true;
}();

}  // namespace
}  // namespace tandem
