#include "tandem/monitor/prometheus.h"

#include <cmath>

#include "tandem/core/strings.h"
#include "tandem/monitor/run_feed.h"

namespace tandem {

std::string prometheus_label(const std::string& value) {
  std::string out;
  for (const char c : value) {
    if (c == '\\' || c == '"')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void PrometheusText::family(const std::string& name, const char* type, const std::string& help) {
  out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void PrometheusText::sample(const std::string& name, double value, const std::string& labels) {
  std::string all = base_;
  if (!labels.empty()) all += (all.empty() ? "" : ",") + labels;
  // The exposition format spells the non-finite values NaN, +Inf and -Inf.
  const std::string text = std::isnan(value)   ? "NaN"
                           : std::isinf(value) ? (value > 0 ? "+Inf" : "-Inf")
                                               : strprintf("%.15g", value);
  out_ += name + (all.empty() ? "" : "{" + all + "}") + " " + text + "\n";
}

namespace {

// j[key] is there and a number (a row's NaN is written as null; a hand-edited file may hold anything).
bool has_number(const nlohmann::json& j, const std::string& key) { return j.contains(key) && j[key].is_number(); }

// A gauge from a JSON key when present.
void gauge(PrometheusText& e, const nlohmann::json& j, const char* key, const std::string& name,
           const std::string& help, double scale = 1.0, const std::string& extra = "") {
  if (!has_number(j, key)) return;
  e.family(name, "gauge", help);
  e.sample(name, j[key].get<double>() * scale, extra);
}

}  // namespace

std::string prometheus_text(const RunFeed& feed, const std::string& run_label) {
  PrometheusText e(run_label.empty() ? "" : "run=\"" + prometheus_label(run_label) + "\"");
  const nlohmann::json row = feed.latest_row(), s = feed.latest_sample();
  const RunFeed::Totals t = feed.totals();

  e.family("tandem_up", "gauge", "1 while the run is training, 0 once it has finished.");
  e.sample("tandem_up", feed.done() ? 0 : 1);
  if (has_number(row, "step")) {
    e.family("tandem_steps_total", "counter", "Optimizer steps completed.");
    e.sample("tandem_steps_total", row["step"].get<double>());
  }
  if (has_number(row, "tokens")) {
    e.family("tandem_tokens_total", "counter", "Training tokens consumed.");
    e.sample("tandem_tokens_total", row["tokens"].get<double>());
  }
  gauge(e, row, "loss", "tandem_loss", "Training loss of the latest step.");
  if (t.eval_loss >= 0) {
    e.family("tandem_eval_loss", "gauge", "Latest held-out loss.");
    e.sample("tandem_eval_loss", t.eval_loss);
  }
  gauge(e, row, "lr", "tandem_learning_rate", "Learning rate of the latest step.");
  gauge(e, row, "grad_norm", "tandem_grad_norm", "Global gradient norm of the latest step, before clipping.");
  gauge(e, row, "step_time_s", "tandem_step_duration_seconds", "Wall time of the latest step.");
  gauge(e, row, "tokens_per_s", "tandem_tokens_per_second", "Training throughput of the latest step.");
  gauge(e, row, "loss_scale", "tandem_loss_scale", "Dynamic loss scale (fp16).");
  gauge(e, row, "offload_k", "tandem_offload_update_split_ratio",
        "Share of Blocks whose optimizer update runs on the GPU (the update split k).");
  gauge(e, row, "offload_gpu_blocks", "tandem_offload_gpu_blocks", "Blocks updated on the GPU.");
  if (has_number(row, "offload_rollbacks")) {
    e.family("tandem_offload_rollbacks_total", "counter", "Speculative CPU updates rolled back.");
    e.sample("tandem_offload_rollbacks_total", row["offload_rollbacks"].get<double>());
  }
  bool phase_family = false;
  for (const char* p : {"forward", "backward", "update", "idle", "transfer", "cpu_update", "nvme_wait"}) {
    const std::string key = std::string("time_") + p + "_s";
    if (!has_number(row, key)) continue;
    if (!phase_family)
      e.family("tandem_step_phase_seconds", "gauge",
               "The latest step's time split: compute-stream phases, and the overlapped transfers, CPU update "
               "and its wait for the NVMe tier's reads.");
    phase_family = true;
    e.sample("tandem_step_phase_seconds", row[key].get<double>(), std::string("phase=\"") + p + "\"");
  }
  gauge(e, row, "nvme_read_bytes", "tandem_nvme_read_bytes", "Bytes the NVMe tier read in the latest step.");
  gauge(e, row, "nvme_written_bytes", "tandem_nvme_written_bytes", "Bytes the NVMe tier wrote in the latest step.");
  gauge(e, row, "mem_device_bytes", "tandem_device_memory_allocated_bytes", "Bytes held by tensors on the device.");
  gauge(e, row, "mem_device_reserved_bytes", "tandem_device_memory_reserved_bytes",
        "Bytes reserved by the device caching allocator.");
  gauge(e, row, "mem_host_peak_bytes", "tandem_process_resident_peak_bytes", "Peak resident set size of tandem.");

  // Hardware: the sampler's latest reading.
  const std::string gpu = "gpu=\"0\"";
  gauge(e, s, "gpu_util_pct", "tandem_gpu_utilization_ratio", "GPU SM busy share (NVML).", 0.01, gpu);
  gauge(e, s, "gpu_mem_util_pct", "tandem_gpu_memory_bus_utilization_ratio", "GPU memory controller busy share.", 0.01,
        gpu);
  gauge(e, s, "gpu_mem_used_bytes", "tandem_gpu_memory_used_bytes", "GPU memory in use (all processes).", 1.0, gpu);
  gauge(e, s, "gpu_mem_total_bytes", "tandem_gpu_memory_total_bytes", "GPU memory.", 1.0, gpu);
  gauge(e, s, "gpu_temp_c", "tandem_gpu_temperature_celsius", "GPU temperature.", 1.0, gpu);
  gauge(e, s, "gpu_power_w", "tandem_gpu_power_watts", "GPU board power draw.", 1.0, gpu);
  gauge(e, s, "gpu_sm_clock_mhz", "tandem_gpu_sm_clock_hertz", "GPU SM clock.", 1e6, gpu);
  gauge(e, s, "cpu_util_pct", "tandem_cpu_utilization_ratio", "Host CPU busy share, all cores.", 0.01);
  if (s.contains("cpu_core_pct") && s["cpu_core_pct"].is_array() && !s["cpu_core_pct"].empty()) {
    e.family("tandem_cpu_core_utilization_ratio", "gauge", "Host CPU busy share per core.");
    int c = 0;
    for (const auto& v : s["cpu_core_pct"]) {
      const std::string core = "core=\"" + std::to_string(c++) + "\"";
      if (v.is_number()) e.sample("tandem_cpu_core_utilization_ratio", v.get<double>() * 0.01, core);
    }
  }
  gauge(e, s, "cpu_process_pct", "tandem_process_cpu_cores", "CPU cores busy with tandem (1 = one core).", 0.01);
  gauge(e, s, "host_mem_used_bytes", "tandem_host_memory_used_bytes", "Host memory in use (MemTotal - MemAvailable).");
  gauge(e, s, "host_mem_total_bytes", "tandem_host_memory_total_bytes", "Host memory.");
  gauge(e, s, "host_rss_bytes", "tandem_process_resident_bytes", "Resident set size of tandem.");
  if (t.has_gpu_energy) {
    e.family("tandem_gpu_energy_joules_total", "counter", "GPU energy used by the run's steps (NVML counter).");
    e.sample("tandem_gpu_energy_joules_total", t.energy_gpu_j, gpu);
  }
  if (t.has_cpu_energy) {
    e.family("tandem_cpu_energy_joules_total", "counter", "CPU package energy used by the run's steps (RAPL).");
    e.sample("tandem_cpu_energy_joules_total", t.energy_cpu_j);
  }
  gauge(e, row, "energy_gpu_j_per_token", "tandem_gpu_energy_joules_per_token", "GPU energy per token, latest step.",
        1.0, gpu);
  gauge(e, row, "energy_cpu_j_per_token", "tandem_cpu_energy_joules_per_token", "CPU energy per token, latest step.");
  return e.str();
}

}  // namespace tandem
