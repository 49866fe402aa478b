#pragma once
// The telemetry sampler: a thread that reads the GPUs (NVML) and the host (/proc, RAPL) every
// period and keeps the latest reading and a bounded history. Missing sources leave their fields
// empty and are named once in why_missing(); nothing here ever stops training.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tandem/monitor/host_stats.h"
#include "tandem/monitor/nvml.h"

namespace tandem {

struct TelemetrySample {
  double t = 0;                   ///< seconds since the sampler started
  std::vector<GpuReading> gpus;   ///< the watched GPUs, in the order given
  HostReading host;
};

struct SamplerOptions {
  double period_s = 0.5;
  std::vector<int> cuda_devices;  ///< CUDA indices to watch (mapped to NVML by PCI bus id)
  size_t history = 4096;          ///< samples kept
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string proc_root = "/proc", powercap_root = "/sys/class/powercap";
  /// Called on the sampler's thread with each new sample (feeds the live endpoints).
  std::function<void(const TelemetrySample&)> on_sample;
};

/// Cumulative energy counters read at one moment.
struct EnergyCounters {
  std::optional<double> gpu_j;  ///< summed over the watched GPUs (NVML's counter)
  std::optional<double> cpu_j;  ///< summed over CPU packages (RAPL)
};

class Sampler {
 public:
  explicit Sampler(SamplerOptions options);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  /// One line per missing source ("" when everything is there).
  const std::vector<std::string>& why_missing() const { return missing_; }
  bool has_gpu() const { return !nvml_index_.empty(); }
  /// The latest sample (empty before the first).
  TelemetrySample latest() const;
  /// Samples newer than `t` (seconds since start).
  std::vector<TelemetrySample> since(double t) const;
  /// Takes a sample now, on the calling thread, as the thread would (history and on_sample).
  void sample_now();
  /// The sampler's time origin on the steady clock, in seconds (a sample's t is relative to it).
  double start_s() const { return t0_; }
  /// Reads the energy counters now, on the calling thread (for per-step energy).
  EnergyCounters energy_now();
  /// CPU time the sampler thread has used so far, and the samples taken.
  double thread_cpu_s() const { return thread_cpu_s_.load(); }
  int64_t samples() const { return samples_.load(); }

 private:
  void loop();
  TelemetrySample take();
  SamplerOptions options_;
  std::unique_ptr<Nvml> nvml_;
  std::vector<int> nvml_index_;  // per watched CUDA device
  HostMonitor host_;
  std::mutex host_mu_;           // HostMonitor keeps deltas: one reader at a time
  std::vector<std::string> missing_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TelemetrySample> history_;
  bool stop_ = false;
  double t0_ = 0;
  std::atomic<double> thread_cpu_s_{0};
  std::atomic<int64_t> samples_{0};
  std::thread thread_;
};

/// The PCI bus id of a CUDA device ("0000:3B:00.0"), "" without one (set by the CUDA backend).
std::string cuda_pci_bus_id(int cuda_index);

}  // namespace tandem
