#include "tandem/run/engine_setup.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/core/thread_pool.h"
#include "tandem/engine/param_store.h"
#include "tandem/memory/host_fit.h"
#include "tandem/memory/plan.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/parallel/comm.h"
#include "tandem/run/placement_driver.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

// Store Blocks (embedding, layers, head) of a plan's decoder-layer count: the GPU prefix includes
// the embedding when layers > 0 and the layout holds it.
int64_t store_blocks_of(int64_t layers, const PlanLayout& layout) {
  return layers > 0 ? layers + (layout.first == 0 ? 1 : 0) : 0;
}

}  // namespace

OffloadParts::OffloadParts() = default;
OffloadParts::OffloadParts(OffloadParts&&) noexcept = default;
OffloadParts& OffloadParts::operator=(OffloadParts&&) noexcept = default;
OffloadParts::~OffloadParts() = default;

int64_t plan_gpu_blocks(const ModelSpec& spec, Config& cfg, int64_t seq_len, const c10::Device& device,
                        std::pair<int64_t, int64_t>* range, const RankInfo& ranks, const PlanLayout& layout) {
  const auto fixed = parse_update_split(cfg.offload.update_split);
  MemoryCapacity cap;
  cap.host_available = cfg.offload.host_memory_gib > 0
                           ? static_cast<int64_t>(cfg.offload.host_memory_gib * double(1 << 30))
                           : host_available_bytes();
  // The ranks on this host share its memory (each plan counts only its own rank's buffers: its
  // stage, its shards; Note [Plan layout]).
  cap.host_available /= ranks.local_world_size;
  if (device.is_cuda() && accelerator()) cap.gpu_total = accelerator()->memory_stats(device.index()).total;
  const int64_t stage_layers = layout_layers(spec, layout);
  int64_t layers = 0;
  if (fixed) {
    layers = std::llround(*fixed * double(stage_layers));
  } else if (cap.gpu_total > 0) {
    // auto: the largest prefix the memory plan allows; the measured re-solve refines it later.
    layers = std::max<int64_t>(0, largest_fitting_gpu_blocks(spec, cfg, seq_len, cap, layout));
  }
  const bool ring_auto = cfg.offload.host_ring < 0;
  cfg.offload = resolve_host_ring(spec, cfg, seq_len, layers, cap, layout);
  if (ring_auto && cfg.offload.host_ring > 0)
    log::info(
        strprintf("offload: per-block host buffers do not fit the host; a ring of %lld slots instead, no undo "
                  "log (offload.host_ring=auto, Note [Host ring])",
                  static_cast<long long>(cfg.offload.host_ring)));
  const bool nvme_auto = cfg.offload.nvme_blocks < 0;
  cfg.offload.nvme_blocks = resolve_nvme_blocks(spec, cfg, seq_len, layers, cap, layout);
  if (nvme_auto && cfg.offload.nvme_blocks > 0)
    log::info(strprintf("offload: the host holds the states of all but the last %lld CPU-updated blocks; theirs go "
                        "to the NVMe tier in %s, updates after the norm (offload.nvme_blocks=auto, Note [NVMe tier])",
                        static_cast<long long>(cfg.offload.nvme_blocks), cfg.offload.nvme_path.c_str()));
  MemoryPlan plan = plan_offload_memory(spec, cfg, seq_len, layers, layout);
  if (cap.gpu_total > 0) {
    std::string why;
    plan = guard_pinned_memory(plan, spec, cfg, seq_len, layers, cap, &why);  // Note [Host memory guard]
    if (!why.empty()) log::warn(why);
    try {
      check_plan_fits(plan, cap, cfg.offload, cfg.train);
    } catch (const UserError& e) {
      // Note [Adaptive micro-batch]: a plan that fits at micro-batch 1 may start; the first
      // out-of-memory error halves the micro-batch. One that does not fit even then is refused.
      Config one = cfg;
      one.train.micro_batch = 1;
      if (!cfg.train.oom_retry || cfg.train.micro_batch == 1 ||
          !plan_fits(plan_offload_memory(spec, one, seq_len, layers, layout), cap, cfg.offload))
        throw;
      log::warn(std::string(e.what()) +
                " -- starting anyway: the plan fits at micro-batch 1 and train.oom_retry halves the micro-batch on "
                "out-of-memory");
    }
  }
  check_host_fits(host_demand(plan, !device.is_cuda()), cap.host_available, spec, cfg, !device.is_cuda());
  const std::string where = layout.describe();
  log::info(
      strprintf("offload: %lld of %lld decoder blocks updated on the %s (k = %.2f) | plan%s: device %s, %s host %s",
                static_cast<long long>(layers), static_cast<long long>(stage_layers),
                device.is_cuda() ? "GPU" : "device", stage_layers ? double(layers) / double(stage_layers) : 0.0,
                where.empty() ? "" : (" of rank " + std::to_string(ranks.rank) + ", " + where).c_str(),
                format_bytes(double(plan.gpu_bytes())).c_str(), plan.pinned ? "pinned" : "pageable",
                format_bytes(double(plan.pinned ? plan.pinned_bytes() : plan.pageable_bytes())).c_str()));
  // The range the split solver may move within: every layer count whose plan fits both tiers.
  int64_t lo = layers, hi = layers;
  if (cap.gpu_total > 0) {
    const auto fits = [&](int64_t l) {
      return plan_fits(plan_offload_memory(spec, cfg, seq_len, l, layout), cap, cfg.offload);
    };
    while (lo > 0 && fits(lo - 1)) --lo;
    while (hi < stage_layers && fits(hi + 1)) ++hi;
  } else {
    lo = 0, hi = stage_layers;  // the CPU as the device: one memory, no plan tiers to respect
  }
  *range = {store_blocks_of(lo, layout), store_blocks_of(hi, layout)};
  return store_blocks_of(layers, layout);
}

EngineOptions engine_options(const RunPlan& plan, const RunContext& ctx,
                             decltype(EngineOptions::trace_counters) trace_counters) {
  return engine_options(plan.cfg, plan.split_range, plan.run_dir, ctx, std::move(trace_counters));
}

void agree_on_offload_plan(const RunContext& ctx, int64_t& gpu_blocks, std::pair<int64_t, int64_t>& range,
                           OffloadConfig& offload, const PlanLayout& layout) {
  if (ctx.comm) {  // the stage's first replica's (stage-major ranks): stages plan their own Blocks
    constexpr size_t kValues = 5;
    const auto all = ctx.comm->all_gather(std::vector<double>{double(gpu_blocks), double(offload.host_ring),
                                                              double(range.first), double(range.second),
                                                              double(offload.nvme_blocks)});
    const auto plan0 = all.begin() + static_cast<std::ptrdiff_t>(layout.stage * layout.replicas * kValues);
    gpu_blocks = static_cast<int64_t>(plan0[0]);
    offload.host_ring = static_cast<int64_t>(plan0[1]);
    range = {static_cast<int64_t>(plan0[2]), static_cast<int64_t>(plan0[3])};
    offload.nvme_blocks = static_cast<int64_t>(plan0[4]);
  }
  if (offload.nvme_path.empty() || offload.nvme_blocks < 0) offload.nvme_blocks = 0;  // unresolved: none
  if (offload.nvme_blocks > 0) offload.speculate = Speculation::kNever;  // Note [NVMe tier]: no undo log
}

EngineOptions engine_options(const Config& cfg, std::pair<int64_t, int64_t> split_range, const std::string& run_dir,
                             const RunContext& ctx, decltype(EngineOptions::trace_counters) trace_counters) {
  EngineOptions eo;
  eo.adam.beta1 = cfg.optim.beta1;
  eo.adam.beta2 = cfg.optim.beta2;
  eo.adam.eps = cfg.optim.eps;
  eo.adam.weight_decay = cfg.optim.weight_decay;
  eo.adam.decoupled = cfg.optim.type == OptimizerType::kAdamW;
  eo.grad_clip = cfg.train.grad_clip;
  eo.speculate = cfg.offload.speculate == Speculation::kAlways  ? EngineOptions::Speculate::kAlways
                 : cfg.offload.speculate == Speculation::kNever ? EngineOptions::Speculate::kNever
                                                                : EngineOptions::Speculate::kAuto;
  eo.delayed = cfg.offload.delayed_update;
  eo.delayed_after = cfg.offload.delayed_after;
  eo.mirror_every = cfg.placement.mirror_every;
  eo.state_rounding =
      cfg.optim.state_rounding == StateRounding::kStochastic ? Rounding::kStochastic : Rounding::kNearestEven;
  eo.solve_split = true;
  eo.fixed_k = parse_update_split(cfg.offload.update_split);
  eo.min_gpu_blocks = split_range.first;
  eo.max_gpu_blocks = split_range.second;
  eo.resolve_every = cfg.offload.resolve_every;
  eo.trace_steps =
      ctx.main_rank() ? parse_step_list(cfg.offload.trace_steps, "offload.trace_steps") : std::vector<int64_t>{};
  eo.comm = ctx.comm.get();
  eo.trace_path = (fs::path(run_dir) / "trace.json").string();
  eo.log = [](const std::string& line) { log::info(line); };
  eo.trace_counters = std::move(trace_counters);
  return eo;
}

ParamStoreOptions store_options(const Config& cfg, const RunContext& ctx) {
  ParamStoreOptions so;
  so.device = ctx.device;
  so.compute_dtype = compute_dtype(cfg.train.precision);
  so.pin_memory = cfg.offload.pin_memory;
  so.host_state_dtype = cfg.optim.state_dtype == StateDtype::kBf16   ? torch::kBFloat16
                        : cfg.optim.state_dtype == StateDtype::kInt8 ? torch::kInt8
                                                                      : torch::kFloat32;
  so.device_state_dtype = device_state_bytes(cfg.optim.device_state_dtype, cfg.optim.state_dtype) == 2
                              ? torch::kBFloat16
                              : torch::kFloat32;
  so.host_master = cfg.optim.master_dtype == MasterDtype::kFp32             ? MasterKind::kFp32
                   : cfg.optim.master_rounding == MasterRounding::kKahan ? MasterKind::kBf16Kahan
                                                                         : MasterKind::kBf16Stochastic;
  so.ring_slots = cfg.offload.host_ring;
  so.undo = keeps_undo_log(cfg.offload);  // none with the ring or the NVMe tier, resolved above
  so.nvme_path = cfg.offload.nvme_path;
  so.nvme_blocks = std::max<int64_t>(cfg.offload.nvme_blocks, 0);
  so.decay_1d = cfg.optim.decay_1d;
  if (ctx.comm && cfg.dist.zero_stage == 2) {  // over the stage's replicas (the world without a pipeline)
    so.shard_rank = ctx.comm->replica();
    so.shard_count = ctx.comm->replicas();
    so.comm = ctx.comm.get();
  }
  return so;
}

OffloadParts build_offload(Model& model, const RunPlan& plan, const RunContext& ctx,
                           decltype(EngineOptions::trace_counters) trace_counters, double build_s) {
  // Parameters stay on the host as the fp32 masters; only buffers (RoPE tables) move.
  for (auto& b : model.buffers()) b.set_data(b.to(ctx.device));
  return build_offload(model, OffloadSetup{plan.cfg, plan.gpu_blocks, plan.split_range, plan.run_dir}, ctx,
                       std::move(trace_counters), build_s);
}

OffloadParts build_offload(BlockSequence& model, const OffloadSetup& setup, const RunContext& ctx,
                           decltype(EngineOptions::trace_counters) trace_counters, double build_s) {
  const Config& cfg = setup.cfg;
  OffloadParts parts;
  const ParamStoreOptions so = store_options(cfg, ctx);
  // The CPU updates run on the global pool: this rank's share of the cores (Note [Core division];
  // optim.cpu_threads, TANDEM_CPU_THREADS or OMP_NUM_THREADS override), pinned with optim.cpu_pin.
  CpuThreadPool::configure_global(resolve_cpu_threads(static_cast<int>(cfg.optim.cpu_threads)), cfg.optim.cpu_pin);
  const auto t_store = std::chrono::steady_clock::now();
  parts.store = std::make_unique<ParamStore>(model, so, setup.gpu_blocks);
  EngineOptions eo = engine_options(cfg, setup.split_range, setup.run_dir, ctx, std::move(trace_counters));
  // Note [Block placement]: Blocks that may run on the CPU stay CPU-updated whatever the split.
  const std::vector<bool> movable = placement_movable(cfg.placement, model);
  const auto n_movable = std::count(movable.begin(), movable.end(), true);
  if (n_movable > 0) {
    TANDEM_CHECK(!ctx.comm, "placement.policy=", to_string(cfg.placement.policy),
                 " runs in one process; run one process or set placement.policy=off");
    TANDEM_CHECK(so.ring_slots == 0, "placement.policy=", to_string(cfg.placement.policy),
                 " needs per-block host buffers, but the memory plan chose a host ring of ", so.ring_slots,
                 " slots (host memory is short): set offload.host_ring=0 if the host holds them, or "
                 "placement.policy=off");
    parts.store->keep_cpu_updated(movable);
    eo.max_gpu_blocks = std::min<int64_t>(eo.max_gpu_blocks, static_cast<int64_t>(movable.size()) - n_movable);
    eo.min_gpu_blocks = std::min(eo.min_gpu_blocks, eo.max_gpu_blocks);
  }
  const double store_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_store).count();
  log::info(
      strprintf("offload: start-up %.1f s: model built in %.1f s, parameter store (%s host buffers) in %.1f s, "
                "%.1f s of it pinning",
                build_s + store_s, build_s, so.pin_memory && ctx.device.is_cuda() ? "pinned" : "plain", store_s,
                parts.store->pin_seconds()));
  if (DiskStates* disk = parts.store->disk()) {
    int64_t blocks = 0, bytes = 0;
    for (auto& b : parts.store->blocks())
      if (b.nvme && b.side == UpdateSide::kCpu) ++blocks, bytes += disk->file_bytes(b);
    log::info(strprintf("offload: NVMe tier in %s: the states of %lld blocks, %s on disk, read and written with %s%s",
                        disk->tier().dir().c_str(), static_cast<long long>(blocks), format_bytes(double(bytes)).c_str(),
                        disk->tier().async() ? "io_uring" : "pread/pwrite",
                        disk->tier().direct() ? ", O_DIRECT" : " through the page cache"));
  }
  parts.engine = std::make_unique<OffloadEngine>(model, *parts.store, eo);
  if (cfg.placement.policy != PlacementPolicyKind::kOff)
    parts.placement = std::make_unique<PlacementDriver>(cfg.placement, model, *parts.engine,
                                                        [](const std::string& line) { log::info(line); });
  return parts;
}

}  // namespace tandem
