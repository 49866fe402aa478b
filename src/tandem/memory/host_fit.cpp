#include "tandem/memory/host_fit.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/memory/estimate.h"

namespace tandem {
namespace {

std::string gib(int64_t bytes) { return strprintf("%.2f GiB", double(bytes) / (1024.0 * 1024.0 * 1024.0)); }

}  // namespace

// Note [Host fit]
// The kernel does not refuse an allocation larger than the host: it grants it and later kills the
// process (or pinning fails deep inside a run). So every run is checked against MemAvailable
// before the model is built: on the CPU as the device, everything training holds is host memory;
// on a GPU without the offload engine, the fp32 model is built on the host first; with the offload
// engine, the plan's host rows. The message names the total, its largest parts, what is available
// and what would bring the run within it.

int64_t HostDemand::total() const {
  int64_t sum = 0;
  for (const auto& r : rows) sum += r.second;
  return sum;
}

HostDemand host_demand(const ModelSpec& spec, const Config& cfg, int64_t seq_len, bool cpu_device) {
  HostDemand d;
  if (!cpu_device) {
    d.rows.emplace_back("fp32 model built on the host before it moves to the GPU", 4 * spec.num_params());
    if (cfg.model.activation_offload != 0)  // Note [Activation host arena]: reserved while the model is built
      d.rows.emplace_back("activations of the offloaded layers (model.activation_offload, pinned)",
                          offloaded_activation_bytes(spec, cfg, seq_len));
    return d;
  }
  const auto e =
      estimate_training_memory(spec, cfg.train.micro_batch, seq_len, cfg.train.precision, cfg.model.checkpointing);
  d.rows = e.rows();
  return d;
}

HostDemand host_demand(const MemoryPlan& plan, bool cpu_device) {
  HostDemand d;
  for (const auto& r : plan.rows) {
    if (r.tier == kTierGpu && !cpu_device) continue;
    if (r.tier == kTierNvme) continue;  // on disk (Note [NVMe tier])
    if (r.purpose.find("(transient)") != std::string::npos) continue;
    if (r.purpose.find("reserve") != std::string::npos && cpu_device) continue;  // a GPU allocator's slack
    d.rows.emplace_back(r.purpose, r.bytes);
  }
  return d;
}

void check_host_fits(const HostDemand& demand, int64_t available, const ModelSpec& spec, const Config& cfg,
                     bool cpu_device) {
  const int64_t need = demand.total();
  if (available <= 0 || need <= available) return;
  auto rows = demand.rows;
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::string> parts;
  for (size_t i = 0; i < rows.size() && i < 3; ++i)
    if (rows[i].second > 0) parts.push_back(rows[i].first + " " + gib(rows[i].second));
  std::vector<std::string> fixes;
  const bool offload = cfg.offload.optimizer == OffloadTarget::kCpu;
  if (cfg.train.micro_batch > 1)
    fixes.push_back(strprintf("lower train.micro_batch (now %lld)", (long long)cfg.train.micro_batch));
  if (!cfg.model.checkpointing && cpu_device) fixes.push_back("set model.checkpointing=true");
  if (offload && cfg.optim.state_dtype == StateDtype::kFp32) fixes.push_back("set optim.state_dtype=bf16 or int8");
  if (offload && cfg.optim.state_dtype == StateDtype::kBf16) fixes.push_back("set optim.state_dtype=int8");
  if (offload && cfg.optim.master_dtype == MasterDtype::kFp32) fixes.push_back("set optim.master_dtype=bf16");
  if (cpu_device) fixes.push_back("train on a GPU with offload.optimizer=cpu");
  fixes.push_back("choose a smaller model (tandem inspect shows the estimate)");
  const std::string last = fixes.back();
  fixes.pop_back();
  TANDEM_FAIL("training this model (", format_count(double(spec.num_params())), " parameters) ",
              cpu_device ? "on the CPU" : "", offload ? " with the offload engine" : "", " needs ", gib(need),
              " of host memory (", join(parts, ", "), ") but ", gib(available), " is available; ",
              fixes.empty() ? last : join(fixes, ", ") + " or " + last);
}

void check_gpu_fit(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_total,
                   const PlanLayout& layout) {
  if (gpu_total <= 0) return;
  const int64_t params = layout_params(spec, layout);  // the stage's Blocks (Note [Plan layout])
  const bool has_head = layout.end < 0 || layout.end == spec.n_layer + 2;
  const int64_t nccl = layout.nccl_communicators() * kNcclCommunicatorBytes;
  const int64_t floor = 16 * params + nccl + kGpuWorkspaceReserveBytes;
  const std::string what = layout.stages > 1 ? strprintf("stage %lld of this model (%s parameters)",
                                                         (long long)layout.stage, format_count(double(params)).c_str())
                                             : "this model (" + format_count(double(params)) + " parameters)";
  TANDEM_CHECK(floor <= gpu_total, "training ", what, " on the GPU needs ", gib(floor),
               " for its fp32 weights, gradients and AdamW states alone, more than the GPU's ", gib(gpu_total),
               "; set offload.optimizer=cpu (masters and states in host memory)",
               layout.stages > 1 || layout.replicas > 1 ? ", cut the model into more pipeline stages" : "",
               " or choose a smaller model");
  const int64_t in_flight = layout.in_flight();
  const auto need = [&](int64_t b) {
    const auto a = activation_cost(spec, b, seq_len, cfg.train.precision, cfg.model.checkpointing);
    return floor + a.activations(layout_layers(spec, layout), in_flight) + (has_head ? a.logits * in_flight : 0);
  };
  const int64_t at_b = need(cfg.train.micro_batch);
  // One process halves its micro-batch on out-of-memory (train.oom_retry); several ranks do not.
  const bool retries = layout.stages == 1 && layout.replicas == 1;
  if (at_b <= (retries ? 2 : 1) * gpu_total) return;
  int64_t fits = 0;  // the largest power-of-two micro-batch the estimate fits
  for (int64_t b = 1; b <= cfg.train.micro_batch && need(b) <= gpu_total; b *= 2) fits = b;
  TANDEM_FAIL("train.micro_batch=", cfg.train.micro_batch, " x ", seq_len, " tokens needs about ", gib(at_b),
              " on the GPU by the estimate", layout.stages > 1 ? " for " + what : std::string(), ", more than ",
              retries ? "twice its " : "its ", gib(gpu_total), "; ",
              fits > 0 ? strprintf("lower train.micro_batch (%lld fits by the estimate) and raise train.grad_accum",
                                   static_cast<long long>(fits))
                       : std::string("even micro-batch 1 does not fit: set model.checkpointing=true, lower "
                                     "train.seq_len or set offload.optimizer=cpu"));
}

}  // namespace tandem
