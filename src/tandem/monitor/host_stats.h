#pragma once
// Host telemetry from the kernel's files: CPU utilisation per core and of this process
// (/proc/stat, /proc/self/stat), host memory (/proc/meminfo, /proc/self/status) and CPU package
// energy from RAPL (/sys/class/powercap/intel-rapl:N/energy_uj, which AMD's driver serves too).
// The roots are parameters so tests can point them at a fake tree.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct HostReading {
  std::optional<double> cpu_pct;           ///< all cores, 0..100, since the previous read
  std::vector<double> core_pct;            ///< per core, 0..100, since the previous read
  std::optional<double> process_cpu_pct;   ///< this process, in cores x 100 (200 = two cores busy)
  std::optional<int64_t> mem_used_bytes;   ///< MemTotal - MemAvailable
  std::optional<int64_t> mem_total_bytes;
  std::optional<int64_t> process_rss_bytes;
  std::optional<double> cpu_energy_j;      ///< summed over packages since this monitor started (wraps undone)
};

class HostMonitor {
 public:
  explicit HostMonitor(std::string proc_root = "/proc", std::string powercap_root = "/sys/class/powercap");
  /// One reading; the utilisation fields need a previous read (the first read leaves them empty).
  HostReading read();
  /// CPU package energy since construction (wraps undone), or empty without RAPL. Cheap: one
  /// small file per package; does not disturb read()'s utilisation deltas.
  std::optional<double> cpu_energy_j();
  /// Why there is no CPU energy ("" when RAPL is readable): e.g. no powercap, or root-only files.
  const std::string& energy_unavailable() const { return no_energy_; }

 private:
  struct Rapl {
    std::string path;
    uint64_t last = 0, range = 0;
    double total_j = 0;
  };
  std::string proc_, powercap_;
  std::vector<Rapl> rapl_;
  std::string no_energy_;
  std::vector<uint64_t> prev_busy_, prev_total_;  // index 0: all cores, then one per core
  uint64_t prev_proc_ticks_ = 0;
  double prev_time_ = -1;
};

}  // namespace tandem
