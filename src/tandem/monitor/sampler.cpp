#include "tandem/monitor/sampler.h"

#include <time.h>

#include <chrono>

#include "tandem/core/device.h"

namespace tandem {
namespace {

double mono_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double thread_cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace

std::string cuda_pci_bus_id(int cuda_index) {
  auto* acc = accelerator();
  return acc ? acc->pci_bus_id(cuda_index) : std::string();
}

Sampler::Sampler(SamplerOptions options)
    : options_(std::move(options)), host_(options_.proc_root, options_.powercap_root) {
  std::string why;
  if (!options_.cuda_devices.empty()) {
    nvml_ = Nvml::open(&why, options_.nvml_library);
    if (!nvml_) {
      missing_.push_back(why);
    } else {
      for (const int d : options_.cuda_devices) {
        const std::string bus = cuda_pci_bus_id(d);
        const int i = bus.empty() ? -1 : nvml_->index_of_pci_bus_id(bus);
        // Without a bus id (no CUDA backend) fall back to the same index: right when no
        // CUDA_VISIBLE_DEVICES reorders the devices.
        nvml_index_.push_back(i >= 0 ? i : (d < nvml_->device_count() ? d : -1));
      }
    }
  }
  if (!host_.energy_unavailable().empty()) missing_.push_back(host_.energy_unavailable());
  t0_ = mono_s();
  {
    std::lock_guard<std::mutex> lock(host_mu_);
    host_.read();  // the baseline for the first utilisation deltas
  }
  thread_ = std::thread([this] { loop(); });
}

Sampler::~Sampler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

TelemetrySample Sampler::take() {
  TelemetrySample s;
  s.t = mono_s() - t0_;
  for (const int i : nvml_index_) s.gpus.push_back(nvml_ && i >= 0 ? nvml_->read(i) : GpuReading{});
  std::lock_guard<std::mutex> lock(host_mu_);
  s.host = host_.read();
  return s;
}

void Sampler::loop() {
  const auto period = std::chrono::duration<double>(options_.period_s);
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_until(lock, next, [&] { return stop_; })) return;
    }
    const double c0 = thread_cpu_now();
    sample_now();
    thread_cpu_s_.store(thread_cpu_s_.load() + thread_cpu_now() - c0);
  }
}

void Sampler::sample_now() {
  TelemetrySample s = take();
  if (options_.on_sample) options_.on_sample(s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    history_.push_back(std::move(s));
    while (history_.size() > options_.history) history_.pop_front();
  }
  ++samples_;
}

TelemetrySample Sampler::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return history_.empty() ? TelemetrySample{} : history_.back();
}

std::vector<TelemetrySample> Sampler::since(double t) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TelemetrySample> out;
  for (const auto& s : history_)
    if (s.t > t) out.push_back(s);
  return out;
}

EnergyCounters Sampler::energy_now() {
  EnergyCounters e;
  if (nvml_) {
    double sum = 0;
    bool any = false;
    for (const int i : nvml_index_) {
      const auto j = i >= 0 ? nvml_->energy_j(i) : std::nullopt;
      if (j) sum += *j, any = true;
    }
    if (any) e.gpu_j = sum;
  }
  std::lock_guard<std::mutex> lock(host_mu_);
  e.cpu_j = host_.cpu_energy_j();
  return e;
}

}  // namespace tandem
