#pragma once
// Device facts behind a narrow interface (no CUDA headers here): the CUDA implementation
// registers itself when tandem is built with CUDA; a CPU-only build has none.

#include <cstdint>
#include <memory>
#include <string>

namespace tandem {

/// Memory counters of one accelerator, in bytes.
struct DeviceMemoryStats {
  int64_t allocated = 0, peak_allocated = 0, reserved = 0, free = 0, total = 0;
};

/// What the trainer needs to know of an accelerator beyond LibTorch's tensor API.
class AcceleratorBackend {
 public:
  virtual ~AcceleratorBackend() = default;
  virtual int device_count() const = 0;
  virtual std::string device_name(int index) const = 0;
  virtual DeviceMemoryStats memory_stats(int index) const = 0;
  virtual void reset_peak_memory(int index) = 0;
  /// Returns the caching allocator's unused blocks to the driver (after an out-of-memory error).
  virtual void empty_cache(int index) = 0;
  virtual void synchronize(int index) = 0;
  /// The device's default generator state as bytes (for checkpoints), and its restore.
  virtual std::string rng_state(int index) const = 0;
  virtual void set_rng_state(int index, const std::string& state) = 0;
  /// Page-locks the host range [ptr, ptr + bytes) for asynchronous copies; false when the driver
  /// refuses (Note [Pinned host buffers]). host_unregister undoes it before the range is unmapped.
  virtual bool host_register(void* ptr, size_t bytes) = 0;
  virtual void host_unregister(void* ptr) = 0;
  /// "0000:3B:00.0", for matching the device in NVML; "" when unknown.
  virtual std::string pci_bus_id(int index) const = 0;
};

/// The registered accelerator backend, or nullptr (CPU-only build or no device).
AcceleratorBackend* accelerator();

/// Called once by the backend's translation unit at static initialisation.
void register_accelerator(std::unique_ptr<AcceleratorBackend> backend);

/// Peak resident set size of this process, in bytes (from /proc/self/status).
int64_t host_peak_rss_bytes();
/// Available host memory (MemAvailable), in bytes.
int64_t host_available_bytes();

}  // namespace tandem
