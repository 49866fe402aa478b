#include "tandem/cli/partition_command.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/models/model.h"
#include "tandem/parallel/pipeline_profile.h"
#include "tandem/run/run_setup.h"
#include "tandem/sched/pipeline_partition.h"

namespace tandem {
namespace {

// One device per rank: the visible GPUs (the profile's device first), or the CPU when it is the
// device; `ranks` beyond them are copies of the first.
std::vector<PipelineDevice> rank_devices(Model& model, const Config& cfg, int64_t seq_len, const c10::Device& device,
                                         int64_t ranks) {
  std::vector<PipelineDevice> out;
  if (device.is_cuda()) {
    out = visible_pipeline_gpus(model, cfg, seq_len);
    std::stable_partition(out.begin(), out.end(), [&](const PipelineDevice& d) { return d.name == device.str(); });
  } else {
    out.push_back(measure_pipeline_device(model, cfg, seq_len, device));
  }
  TANDEM_CHECK(!out.empty(), "no device to plan pipeline stages on");
  if (ranks <= 0) return out;
  out.resize(static_cast<size_t>(ranks), out.front());
  return out;
}

// The stage devices of the chosen plan (with one replica), else the profile's device alone: the
// GPUs the CPU would join.
std::vector<PipelineDevice> gpu_stages(const std::vector<PipelineDevice>& ranks, const PipelinePlan& plan) {
  if (plan.replicas == 1) return stage_devices(ranks, static_cast<int64_t>(plan.stages.size()));
  return {ranks.front()};
}

// Note [CPU pipeline stage] on this machine, the CPU's speed relative to the profile's device;
// whether the CPU stage is chosen.
bool print_cpu_stage(Model& model, const Config& cfg, int64_t seq_len, const std::vector<PipelineDevice>& ranks,
                     const std::optional<PipelinePlan>& plan, const std::vector<PipelineBlockCost>& blocks) {
  auto devices = ranks;
  devices.push_back(measure_pipeline_device(model, cfg, seq_len, c10::Device(c10::kCPU)));
  devices = relative_to_first(devices);
  const PipelineDevice cpu = devices.back();
  devices.pop_back();
  const auto gpus = plan ? gpu_stages(devices, *plan) : std::vector<PipelineDevice>{devices.front()};
  const auto a = analyse_cpu_stage(blocks, gpus, cpu, partition_options(cfg), cfg.placement.gpu_power_budget_w);
  std::printf("\nthe host CPU as one more stage: speed %.3f of %s's, %s available\n", cpu.speed,
              devices.front().name.c_str(), format_bytes(double(cpu.memory_bytes)).c_str());
  if (a.with_cpu && a.helps) std::printf("%s", format_pipeline_plan(blocks, *a.with_cpu).c_str());
  std::printf("%s\n", a.verdict.c_str());
  return a.helps;
}

}  // namespace

int run_partition_inspect(const Config& cfg, const ModelSpec& spec, int64_t seq_len,
                          const PartitionInspectOptions& options) {
  const c10::Device device = resolve_device(cfg.train.device);
  const NumericsGuard numerics(cfg.train, device);
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  auto model = build_model(spec, cfg.model.checkpointing);
  model->train();
  const auto ranks = rank_devices(*model, cfg, seq_len, device, options.ranks);
  const auto blocks = profile_pipeline_blocks(*model, cfg, seq_len, device);
  std::optional<PipelinePlan> plan;
  std::string table, no_plan;
  try {
    plan = plan_from_profile(blocks, cfg, seq_len, ranks, spec.tie_embeddings, &table);
    std::printf("\n%s", table.c_str());
  } catch (const UserError& e) {
    if (!options.with_cpu || device.is_cpu()) throw;
    no_plan = one_line(e.what());
    std::printf("\n%s\nno plan on the GPUs alone: %s\n", format_pipeline_profile(blocks).c_str(), no_plan.c_str());
  }
  if (auto cut = configured_pipeline_cut(cfg.dist, static_cast<int64_t>(blocks.size()))) {
    const auto p = static_cast<int64_t>(cut->size());
    auto given = evaluate_pipeline(blocks, stage_devices(relative_to_first(ranks), p), *cut, partition_options(cfg));
    given.replicas = static_cast<int64_t>(ranks.size()) / p;
    std::printf("\ndist.pipeline_cut=%s, which the run takes instead:\n%s%s", cfg.dist.pipeline_cut.str().c_str(),
                format_pipeline_plan(blocks, given).c_str(), fits(given) ? "" : "it does NOT fit\n");
  }
  bool cpu_helps = false;
  if (options.with_cpu && device.is_cpu())
    std::printf("\nthe host CPU is the training device: no GPU for it to share the Blocks with\n");
  else if (options.with_cpu)
    cpu_helps = print_cpu_stage(*model, cfg, seq_len, ranks, plan, blocks);
  std::fflush(stdout);
  TANDEM_CHECK(plan || cpu_helps, no_plan);
  return 0;
}

}  // namespace tandem
