#pragma once
// NVIDIA's management library, loaded at run time (dlopen of libnvidia-ml.so.1): tandem has no
// build dependency on it, and a machine without it (no driver, CI) has no GPU telemetry, not a
// failed start. Only the calls the sampler needs, with NVML's documented types restated here.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace tandem {

/// One reading of one GPU; a field is empty when the driver does not report it.
struct GpuReading {
  std::optional<double> util_pct;        ///< SM busy share over the driver's last sample period
  std::optional<double> mem_util_pct;    ///< memory-controller busy share
  std::optional<int64_t> mem_used_bytes, mem_total_bytes;
  std::optional<double> temp_c;
  std::optional<double> power_w;         ///< board power draw
  std::optional<double> energy_j;        ///< cumulative since the driver loaded (Volta and later)
  std::optional<double> sm_clock_mhz;
};

class Nvml {
 public:
  /// Loads `library` and initialises NVML; nullptr with the reason in *why when either fails.
  static std::unique_ptr<Nvml> open(std::string* why, const std::string& library = "libnvidia-ml.so.1");
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  int device_count() const { return count_; }
  std::string device_name(int index) const;
  /// NVML index of the device with this PCI bus id ("0000:3B:00.0"), or -1.
  int index_of_pci_bus_id(const std::string& bus_id) const;
  /// Reads every field it can; thread-safe (NVML is).
  GpuReading read(int index) const;
  /// The cumulative energy counter alone (one call).
  std::optional<double> energy_j(int index) const;

 private:
  struct Api;
  Nvml() = default;
  void* lib_ = nullptr;
  std::unique_ptr<Api> api_;
  int count_ = 0;
  bool inited_ = false;
};

}  // namespace tandem
