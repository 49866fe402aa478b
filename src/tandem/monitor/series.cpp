#include "tandem/monitor/series.h"

#include <nlohmann/json.hpp>

namespace tandem {

const std::vector<ChartSpec>& chart_specs() {
  using A = ChartSpec::Axis;
  constexpr double kGiB = 1.0 / (1024.0 * 1024.0 * 1024.0);
  static const std::vector<ChartSpec> specs = {
      {"loss", "Loss", "", A::kSteps, 1.0, false, {{"loss", "training"}, {"eval_loss", "held-out"}}},
      {"throughput", "Throughput", "tokens/s", A::kSteps, 1.0, false, {{"tokens_per_s", "tokens/s"}}},
      // Note [Step time split] (run/step_timer.h): the compute stream's phases add up to the step;
      // the offload engine's transfers and CPU update overlap them and are drawn as lines.
      {"time_split",
       "Step time split",
       "s",
       A::kSteps,
       1.0,
       true,
       {{"time_forward_s", "forward"},
        {"time_backward_s", "backward"},
        {"time_update_s", "norm + GPU update"},
        {"time_idle_s", "idle (compute stream)"},
        {"time_transfer_s", "transfers D2H+H2D (overlapped)", true},
        {"time_cpu_update_s", "CPU update (overlapped)", true},
        {"time_nvme_wait_s", "CPU update waiting for NVMe reads (overlapped)", true}}},
      // Note [NVMe tier]: what the tier's files moved in a step.
      {"nvme",
       "NVMe tier per step",
       "GB",
       A::kSteps,
       1e-9,
       false,
       {{"nvme_read_bytes", "read"}, {"nvme_written_bytes", "written"}}},
      {"split_k", "Update split k (GPU-updated share)", "", A::kSteps, 1.0, false, {{"offload_k", "k"}}},
      // Note [Pipeline parallel]: the stages' idle share of a step against 1F1B's for the measured stage
      // times and for equal stages, (p-1)/(m+p-1).
      {"pipeline_bubble",
       "Pipeline bubble (stages idle)",
       "",
       A::kSteps,
       1.0,
       false,
       {{"pipeline_bubble", "measured"},
        {"pipeline_bubble_schedule", "the schedule's, for the measured stage times", true},
        {"pipeline_bubble_ideal", "(p-1)/(m+p-1)", true}}},
      // Note [Block placement]: the policy's decisions and what they predicted against the step.
      {"placement", "Blocks on the CPU", "blocks", A::kSteps, 1.0, false, {{"placement_cpu_blocks", "on the CPU"}}},
      {"placement_power",
       "GPU power per step: measured, predicted, budget",
       "W",
       A::kSteps,
       1.0,
       false,
       {{"placement_gpu_power_w", "measured (step average)"},
        {"placement_pred_gpu_power_w", "predicted (cost model)", true},
        {"placement_budget_w", "budget", true},
        {"placement_in_gpu_power_w", "policy input (sampler)", true}}},
      {"energy",
       "Energy per token",
       "J/token",
       A::kSteps,
       1.0,
       false,
       {{"energy_gpu_j_per_token", "GPU"}, {"energy_cpu_j_per_token", "CPU packages"}}},
      {"util",
       "Utilisation",
       "%",
       A::kTime,
       1.0,
       false,
       {{"gpu_util_pct", "GPU SMs"}, {"gpu_mem_util_pct", "GPU memory bus"}, {"cpu_util_pct", "CPU (all cores)"}}},
      {"memory",
       "Memory",
       "GiB",
       A::kTime,
       kGiB,
       false,
       {{"gpu_mem_used_bytes", "GPU used"}, {"host_mem_used_bytes", "host used"}, {"host_rss_bytes", "tandem RSS"}}},
      {"power", "GPU power", "W", A::kTime, 1.0, false, {{"gpu_power_w", "board power"}}},
      {"temperature", "GPU temperature", "°C", A::kTime, 1.0, false, {{"gpu_temp_c", "GPU"}}},
  };
  return specs;
}

nlohmann::json chart_specs_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : chart_specs()) {
    nlohmann::json series = nlohmann::json::array();
    for (const auto& s : c.series) series.push_back({{"key", s.key}, {"label", s.label}, {"overlay", s.overlay}});
    out.push_back({{"id", c.id},
                   {"title", c.title},
                   {"unit", c.unit},
                   {"axis", c.axis == ChartSpec::Axis::kSteps ? "step" : "t_s"},
                   {"scale", c.scale},
                   {"stacked", c.stacked},
                   {"series", series}});
  }
  return out;
}

}  // namespace tandem
