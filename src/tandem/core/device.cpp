#include "tandem/core/device.h"

#include <fstream>
#include <sstream>
#include <string>

namespace tandem {
namespace {
std::unique_ptr<AcceleratorBackend>& slot() {
  static std::unique_ptr<AcceleratorBackend> backend;
  return backend;
}

int64_t read_kib_field(const char* file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      std::istringstream ss(line.substr(field.size()));
      int64_t kib = 0;
      ss >> kib;
      return kib * 1024;
    }
  }
  return 0;
}
}  // namespace

AcceleratorBackend* accelerator() { return slot().get(); }
void register_accelerator(std::unique_ptr<AcceleratorBackend> backend) { slot() = std::move(backend); }
int64_t host_peak_rss_bytes() { return read_kib_field("/proc/self/status", "VmHWM:"); }
int64_t host_available_bytes() { return read_kib_field("/proc/meminfo", "MemAvailable:"); }

}  // namespace tandem
