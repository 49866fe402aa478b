#include "tandem/monitor/nvml.h"

#include <dlfcn.h>

#include <vector>

namespace tandem {

// Types as NVML's header defines them (nvml.h is not on the build machine).
using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr int kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kNvmlClockSm = 1;         // NVML_CLOCK_SM

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*count)(unsigned int*);
  nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*handle_by_pci)(const char*, nvmlDevice_t*);
  nvmlReturn_t (*index)(nvmlDevice_t, unsigned int*);
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*util)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*);
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*);
  nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*);
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*);
  const char* (*error_string)(nvmlReturn_t);
  std::vector<nvmlDevice_t> devices;
};

namespace {

template <typename F>
bool bind(void* lib, const char* name, F*& out) {
  out = reinterpret_cast<F*>(dlsym(lib, name));
  return out != nullptr;
}

}  // namespace

std::unique_ptr<Nvml> Nvml::open(std::string* why, const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    if (why) *why = library + " not loadable (no NVIDIA driver): no GPU telemetry";
    return nullptr;
  }
  std::unique_ptr<Nvml> n(new Nvml());
  n->lib_ = lib;
  n->api_ = std::make_unique<Api>();
  auto& a = *n->api_;
  const bool ok = bind(lib, "nvmlInit_v2", a.init) && bind(lib, "nvmlShutdown", a.shutdown) &&
                  bind(lib, "nvmlDeviceGetCount_v2", a.count) &&
                  bind(lib, "nvmlDeviceGetHandleByIndex_v2", a.handle) &&
                  bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", a.handle_by_pci) &&
                  bind(lib, "nvmlDeviceGetIndex", a.index) && bind(lib, "nvmlDeviceGetName", a.name) &&
                  bind(lib, "nvmlDeviceGetUtilizationRates", a.util) &&
                  bind(lib, "nvmlDeviceGetMemoryInfo", a.memory) &&
                  bind(lib, "nvmlDeviceGetTemperature", a.temperature) &&
                  bind(lib, "nvmlDeviceGetPowerUsage", a.power) &&
                  bind(lib, "nvmlDeviceGetTotalEnergyConsumption", a.energy) &&
                  bind(lib, "nvmlDeviceGetClockInfo", a.clock) && bind(lib, "nvmlErrorString", a.error_string);
  if (!ok) {
    if (why) *why = library + " lacks an NVML call tandem uses (driver too old): no GPU telemetry";
    return nullptr;  // the destructor closes the library; init was not called
  }
  if (const nvmlReturn_t r = a.init(); r != 0) {
    if (why) *why = std::string("nvmlInit failed (") + a.error_string(r) + "): no GPU telemetry";
    return nullptr;
  }
  n->inited_ = true;
  unsigned int count = 0;
  if (a.count(&count) != 0) count = 0;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t d = nullptr;
    a.devices.push_back(a.handle(i, &d) == 0 ? d : nullptr);
  }
  n->count_ = static_cast<int>(count);
  return n;
}

Nvml::~Nvml() {
  if (inited_) api_->shutdown();
  if (lib_) dlclose(lib_);
}

std::string Nvml::device_name(int index) const {
  char buf[96] = {0};
  if (index < 0 || index >= count_ || !api_->devices[index] || api_->name(api_->devices[index], buf, sizeof buf) != 0)
    return "";
  return buf;
}

int Nvml::index_of_pci_bus_id(const std::string& bus_id) const {
  nvmlDevice_t d = nullptr;
  unsigned int idx = 0;
  if (api_->handle_by_pci(bus_id.c_str(), &d) != 0 || api_->index(d, &idx) != 0) return -1;
  return static_cast<int>(idx);
}

std::optional<double> Nvml::energy_j(int index) const {
  unsigned long long mj = 0;
  if (index < 0 || index >= count_ || !api_->devices[index] || api_->energy(api_->devices[index], &mj) != 0)
    return std::nullopt;
  return static_cast<double>(mj) / 1000.0;
}

GpuReading Nvml::read(int index) const {
  GpuReading r;
  if (index < 0 || index >= count_ || !api_->devices[index]) return r;
  const auto d = api_->devices[index];
  const auto& a = *api_;
  nvmlUtilization_t u{};
  if (a.util(d, &u) == 0) r.util_pct = u.gpu, r.mem_util_pct = u.memory;
  nvmlMemory_t m{};
  if (a.memory(d, &m) == 0) r.mem_used_bytes = static_cast<int64_t>(m.used), r.mem_total_bytes = static_cast<int64_t>(m.total);
  unsigned int v = 0;
  if (a.temperature(d, kNvmlTemperatureGpu, &v) == 0) r.temp_c = v;
  if (a.power(d, &v) == 0) r.power_w = v / 1000.0;
  unsigned long long mj = 0;
  if (a.energy(d, &mj) == 0) r.energy_j = static_cast<double>(mj) / 1000.0;
  if (a.clock(d, kNvmlClockSm, &v) == 0) r.sm_clock_mhz = v;
  return r;
}

}  // namespace tandem
