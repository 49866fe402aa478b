#include "tandem/memory/plan.h"

#include <algorithm>
#include <functional>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/memory/estimate.h"

namespace tandem {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(int64_t bytes) { return strprintf("%.2f GiB", double(bytes) / kGiB); }

/// The share of `total` a tier may use, in bytes.
int64_t budget(int64_t total, double fraction) { return static_cast<int64_t>(double(total) * fraction); }

int64_t working_bytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

std::string layer_range(int64_t first, int64_t last) {
  return first == last ? strprintf("layer.%lld", (long long)first)
                       : strprintf("layers %lld..%lld", (long long)first, (long long)last);
}

}  // namespace

int64_t MemoryPlan::tier_bytes(const std::string& tier) const {
  int64_t sum = 0;
  for (const auto& r : rows)
    if (r.tier == tier) sum += r.bytes;
  return sum;
}

int64_t PlanLayout::in_flight() const {
  if (stages <= 1) return 1;
  return schedule == PipelineSchedule::kGPipe ? micro_batches : std::min(stages - stage, micro_batches);
}

int64_t PlanLayout::nccl_communicators() const {
  if (!nccl) return 0;
  int64_t n = 0;
  if (replicas > 1) n += shards > 1 ? 2 : 1;  // lane 0 reduces; lane 1 gathers sharded weights
  if (stages > 1) {
    n += 1;                                                         // the global norm over the stages
    n += 2 * ((stage > 0 ? 1 : 0) + (stage < stages - 1 ? 1 : 0));  // a pair per neighbour and direction
  }
  return n;
}

std::string PlanLayout::describe() const {
  std::vector<std::string> parts;
  if (stages > 1)
    parts.push_back(strprintf("stage %lld of %lld (%s, %lld of %lld micro-batches in flight)", (long long)stage,
                              (long long)stages, to_string(schedule), (long long)in_flight(),
                              (long long)micro_batches));
  if (replicas > 1) parts.push_back(strprintf("%lld data-parallel replicas", (long long)replicas));
  if (shards > 1) parts.push_back(strprintf("masters and states sharded %lld ways", (long long)shards));
  return join(parts, ", ");
}

PlanLayout plan_layout(const Config& cfg, int rank, int world, const std::vector<int64_t>& ends, bool nccl) {
  PlanLayout l;
  l.stages = ends.empty() ? 1 : static_cast<int64_t>(ends.size());
  l.replicas = world / l.stages;
  l.stage = rank / l.replicas;
  if (l.stages > 1) {
    l.first = l.stage == 0 ? 0 : ends[static_cast<size_t>(l.stage - 1)];
    l.end = ends[static_cast<size_t>(l.stage)];
  }
  l.schedule = cfg.dist.pipeline_schedule;
  l.micro_batches = cfg.train.grad_accum;
  l.shards = cfg.dist.zero_stage == 2 ? l.replicas : 1;
  l.nccl = nccl && world > 1;
  return l;
}

int64_t layout_layers(const ModelSpec& spec, const PlanLayout& layout) {
  const int64_t end = layout.end < 0 ? spec.n_layer + 2 : layout.end;
  return std::max<int64_t>(0, std::min(end, spec.n_layer + 1) - std::max<int64_t>(layout.first, 1));
}

std::vector<PlanBlock> layout_blocks(const ModelSpec& spec, const PlanLayout& layout, int64_t gpu_blocks) {
  const int64_t first = layout.first, end = layout.end < 0 ? spec.n_layer + 2 : layout.end;
  // The head owns the final norm and, when untied, the lm_head; a tied lm_head is the embedding's
  // matrix and is counted there.
  const int64_t emb = spec.padded_vocab() * spec.d_model;
  int64_t all_layers = 0;
  for (int64_t i = 0; i < spec.n_layer; ++i) all_layers += spec.layer_params(i);
  const int64_t head = spec.num_params() - emb - all_layers;
  const auto side = [&](bool gpu) { return gpu ? UpdateSide::kGpu : UpdateSide::kCpu; };
  std::vector<PlanBlock> out;
  if (first == 0) out.push_back({"embedding", emb, side(gpu_blocks > 0)});
  for (int64_t i = std::max<int64_t>(first, 1) - 1, g = 0; i < std::min(end, spec.n_layer + 1) - 1; ++i, ++g)
    out.push_back({"layer." + std::to_string(i), spec.layer_params(i), side(g < gpu_blocks)});
  if (end == spec.n_layer + 2) out.push_back({"head", head, UpdateSide::kCpu});
  return out;
}

int64_t layout_params(const ModelSpec& spec, const PlanLayout& layout) {
  int64_t n = 0;
  for (const auto& b : layout_blocks(spec, layout, 0)) n += b.params;
  return n;
}

int64_t offloaded_layers(const ModelSpec& spec, int64_t activation_offload, int64_t first, int64_t end) {
  TANDEM_ASSERT(activation_offload != ModelConfig::kAutoActivationOffload,
                "model.activation_offload=auto must be resolved before the plan (resolve_activation_offload)");
  const int64_t n = activation_offload < 0 ? spec.n_layer : std::min(activation_offload, spec.n_layer);
  // Block b (1 .. n_layer) is decoder layer b - 1; the offloaded ones are Blocks 1 .. n.
  const int64_t lo = std::max<int64_t>(first, 1), hi = std::min(end, n + 1);
  return std::max<int64_t>(hi - lo, 0);
}

int64_t offloaded_activation_bytes(const ModelSpec& spec, const Config& cfg, int64_t seq_len, const PlanLayout& layout) {
  const int64_t end = layout.end < 0 ? spec.n_layer + 2 : layout.end;
  const int64_t n_off = offloaded_layers(spec, cfg.model.activation_offload, layout.first, end);
  const auto whole = activation_cost(spec, cfg.train.micro_batch, seq_len, cfg.train.precision, false).kept_per_layer;
  return whole * n_off * layout.in_flight();
}

MemoryPlan plan_offload_memory(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_blocks,
                               const PlanLayout& layout) {
  const int64_t first = layout.first, end = layout.end < 0 ? spec.n_layer + 2 : layout.end;
  const int64_t L = layout_layers(spec, layout);
  TANDEM_ASSERT(first >= 0 && first < end && end <= spec.n_layer + 2, "stage Blocks [", first, ", ", end, ")");
  TANDEM_ASSERT(gpu_blocks >= 0 && gpu_blocks <= L, "gpu_blocks ", gpu_blocks, " outside [0, ", L, "]");
  TANDEM_ASSERT(seq_len > 0, "seq_len ", seq_len);
  const bool has_head = end == spec.n_layer + 2;

  MemoryPlan plan;
  plan.gpu_blocks = gpu_blocks;
  plan.n_layer = L;
  plan.micro_batch = cfg.train.micro_batch;
  plan.seq_len = seq_len;
  plan.checkpointing = cfg.model.checkpointing;
  plan.pinned = cfg.offload.pin_memory;
  plan.layout = layout;

  plan.blocks = layout_blocks(spec, layout, gpu_blocks);

  // Note [NVMe tier]: the last CPU-updated Blocks' states on disk (-1, auto, plans none).
  int64_t nvme_left = cfg.offload.nvme_path.empty() ? 0 : std::max<int64_t>(cfg.offload.nvme_blocks, 0);
  plan.nvme_path = !cfg.offload.nvme_path.empty();
  for (auto b = plan.blocks.rbegin(); b != plan.blocks.rend() && nvme_left > 0; ++b)
    if (b->update == UpdateSide::kCpu) {
      b->nvme = true;
      ++plan.nvme_blocks;
      --nvme_left;
    }
  int64_t n_all = 0, n_gpu = 0, n_cpu = 0, largest = 0, n_nvme = 0, largest_nvme = 0;
  for (const auto& b : plan.blocks) {
    n_all += b.params;
    (b.update == UpdateSide::kGpu ? n_gpu : n_cpu) += b.params;
    largest = std::max(largest, b.params);
    if (b.nvme) {
      n_nvme += b.params;
      largest_nvme = std::max(largest_nvme, b.params);
    }
  }
  TANDEM_ASSERT(layout.stages > 1 || n_all == spec.num_params(), "blocks hold ", n_all, " parameters, the spec ",
                spec.num_params());
  // Note [Sharded store]: each rank holds its slice of every Block's master, states and host buffers.
  const int64_t shards = std::max<int64_t>(layout.shards, 1);
  const auto shard = [&](int64_t n) { return (n + shards - 1) / shards; };

  const int64_t w = working_bytes(cfg.train.precision);
  const StateDtype sd = cfg.optim.state_dtype;
  plan.state_bytes = sd == StateDtype::kFp32 ? 4 : (sd == StateDtype::kBf16 ? 2 : 1);
  const std::string wt = to_string(cfg.train.precision);
  const std::string st = to_string(cfg.optim.state_dtype);
  const std::string host = plan.pinned ? kTierPinned : kTierPageable;
  const int64_t mb = master_bytes(cfg.optim.master_dtype, cfg.optim.master_rounding);
  plan.fp32_master = cfg.optim.master_dtype == MasterDtype::kFp32;
  const std::string master = plan.fp32_master ? "fp32 master"
                             : cfg.optim.master_rounding == MasterRounding::kKahan
                                 ? "bf16 master with its bf16 Kahan compensation"
                                 : "bf16 master (stochastic rounding)";
  const std::string whose = layout.stages > 1 ? "the stage's blocks" : "all blocks";
  const std::string slices = shards > 1 ? strprintf(" (1/%lld slices)", (long long)shards) : "";
  auto add = [&](const std::string& tier, std::string purpose, int64_t bytes) {
    plan.rows.push_back({tier, std::move(purpose), bytes});
  };

  // GPU: every Block's working weights and .grad buffers (whole, sharded or not); master and states
  // of the GPU-updated Blocks; what autograd saves for backward; NCCL's buffers; the reserve.
  add(kTierGpu, "working weights (" + wt + "), " + whose, n_all * w);
  add(kTierGpu, "gradients (" + wt + "), " + whose, n_all * w);
  if (n_gpu > 0) {
    int64_t largest_gpu = 0;
    for (const auto& b : plan.blocks)
      if (b.update == UpdateSide::kGpu) largest_gpu = std::max(largest_gpu, b.params);
    add(kTierGpu, "fp32 master, GPU-updated blocks" + slices, 4 * shard(n_gpu));
    const int64_t dsb = device_state_bytes(cfg.optim.device_state_dtype, sd);  // Note [Device Adam]
    add(kTierGpu,
        std::string("optimizer states m, v (") + (dsb == 2 ? "bf16" : "fp32") + "), GPU-updated blocks" + slices,
        2 * dsb * shard(n_gpu));
    add(kTierGpu, "update scratch (the largest GPU-updated block's gradient in fp32)", 4 * shard(largest_gpu));
  }
  const auto a = activation_cost(spec, cfg.train.micro_batch, seq_len, cfg.train.precision, cfg.model.checkpointing);
  const int64_t in_flight = layout.in_flight();
  const int64_t n_off = offloaded_layers(spec, cfg.model.activation_offload, first, end);
  const std::string flight = in_flight > 1 ? strprintf(", %lld micro-batches in flight", (long long)in_flight) : "";
  if (n_off == 0) {
    add(kTierGpu, std::string("activations (checkpointing ") + (cfg.model.checkpointing ? "on" : "off") + flight + ")",
        a.activations(L, in_flight));
  } else {  // Note [Activation prefetch]: two offloaded layers' tensors on the GPU, the one in its backward and
            // the next, copied back ahead
    const int64_t whole =
        activation_cost(spec, cfg.train.micro_batch, seq_len, cfg.train.precision, false).kept_per_layer;
    add(kTierGpu,
        strprintf("activations (checkpointing %s, %lld of %lld layers offloaded%s)",
                  cfg.model.checkpointing ? "on" : "off", (long long)n_off, (long long)L, flight.c_str()),
        a.kept_per_layer * (L - n_off) * in_flight + std::max(a.layer_working, 2 * whole));
    add(host, strprintf("activations of %lld offloaded layers (model.activation_offload)", (long long)n_off),
        offloaded_activation_bytes(spec, cfg, seq_len, layout));
  }
  if (has_head) add(kTierGpu, "logits and loss", a.logits * (layout.stages > 1 ? in_flight : 1));
  if (layout.stages > 1) {  // a send not yet complete and a receive, activation-sized
    const long double act = static_cast<long double>(cfg.train.micro_batch) * seq_len * spec.d_model * w;
    add(kTierGpu, "stage link buffers (a send and a receive)", static_cast<int64_t>(2 * act));
  }
  const int64_t comms = layout.nccl_communicators();
  if (comms > 0)
    add(kTierGpu, strprintf("NCCL buffers (%lld communicators)", (long long)comms), comms * kNcclCommunicatorBytes);
  add(kTierGpu, "allocator and workspace reserve", kGpuWorkspaceReserveBytes);
  plan.gpu_floor_bytes = 2 * n_all * w + comms * kNcclCommunicatorBytes + kGpuWorkspaceReserveBytes;

  // Host: the CPU-updated Blocks' optimizer side (the head's when the stage holds it).
  if (n_cpu > 0) {
    add(host, master + ", CPU-updated blocks" + slices, mb * shard(n_cpu));
    const std::string states =
        "optimizer states m, v (" + st + (sd == StateDtype::kInt8 ? " with a scale per 2048" : "") + "), ";
    if (n_cpu > n_nvme)
      add(host, states + "CPU-updated blocks" + (n_nvme > 0 ? " off the NVMe tier" : "") + slices,
          2 * state_buffer_bytes(sd, shard(n_cpu - n_nvme)));
    if (n_nvme > 0) {
      add(kTierNvme, states + strprintf("%lld blocks", (long long)plan.nvme_blocks) + slices,
          2 * state_buffer_bytes(sd, shard(n_nvme)));
      add(host,
          strprintf("NVMe bounce slots (%lld, the largest NVMe-tier block's states)", (long long)kNvmeBounceSlots),
          kNvmeBounceSlots * 2 * state_buffer_bytes(sd, shard(largest_nvme)));
    }
  }
  // The CPU kernels read bf16 or fp32 gradients: fp16 ones land widened to fp32.
  const bool bf16 = cfg.train.precision == Precision::kBf16;
  const std::string gt = bf16 ? "bf16" : "fp32";
  const int64_t g = bf16 ? 2 : 4;
  const int64_t ring = std::max<int64_t>(cfg.offload.host_ring, 0);  // auto plans per-block buffers
  plan.host_ring = ring;
  if (n_cpu > 0 && ring == 0) {
    add(host, "gradient landing buffers (" + gt + ")" + slices, shard(n_cpu) * g);
    add(host, "weight staging buffers (" + wt + ")" + slices, shard(n_cpu) * w);
  } else if (n_cpu > 0) {
    add(host, strprintf("gradient landing ring (%lld slots, %s)", (long long)ring, gt.c_str()),
        ring * shard(largest) * g);
    add(host, strprintf("weight staging ring (%lld slots, %s)", (long long)ring, wt.c_str()),
        ring * shard(largest) * w);
  }
  // Speculative updates keep an undo log for the clipping and non-finite rollbacks (even without
  // clipping: a non-finite gradient rolls back too).
  if (n_cpu > 0 && ring == 0 && keeps_undo_log(cfg.offload) && plan.nvme_blocks == 0)
    add(host, "undo log (speculative updates)" + slices, mb * shard(n_cpu) + 2 * state_buffer_bytes(sd, shard(n_cpu)));

  add(kTierPageable, "initial fp32 model during build (transient)", 4 * n_all);
  return plan;
}

MemoryPlan guard_pinned_memory(const MemoryPlan& plan, const ModelSpec& spec, Config& cfg, int64_t seq_len,
                               int64_t gpu_blocks, const MemoryCapacity& cap, std::string* why) {
  if (!cfg.offload.pin_memory || cap.host_available <= 0 ||
      plan.pinned_bytes() <= budget(cap.host_available, cfg.offload.host_memory_fraction))
    return plan;
  Config pageable = cfg;
  pageable.offload.pin_memory = false;
  MemoryPlan pp = plan_offload_memory(spec, pageable, seq_len, gpu_blocks, plan.layout);
  // Pageable memory can be paged out, but not past what is available: keep 5% for the rest.
  if (pp.pageable_bytes() + pp.pinned_bytes() > budget(cap.host_available, 0.95)) return plan;
  if (why)
    *why = strprintf(
        "pinned host buffers of %s would exceed offload.host_memory_fraction=%.2f of the %s available, leaving the "
        "host to swap or to the OOM killer; using pageable buffers instead (offload.pin_memory=false): every "
        "host-device copy is staged through the driver, at about half the bandwidth, and overlaps compute less. "
        "Raise offload.host_memory_fraction to pin anyway",
        gib(plan.pinned_bytes()).c_str(), cfg.offload.host_memory_fraction, gib(cap.host_available).c_str());
  cfg.offload.pin_memory = false;
  return pp;
}

bool plan_fits(const MemoryPlan& plan, const MemoryCapacity& cap, const OffloadConfig& offload) {
  const bool gpu_over = plan.gpu_bytes() > budget(cap.gpu_total, offload.gpu_memory_fraction);
  const bool host_over =
      cap.host_available > 0 && plan.pinned_bytes() > budget(cap.host_available, offload.host_memory_fraction);
  return !gpu_over && !host_over;
}

void check_plan_fits(const MemoryPlan& plan, const MemoryCapacity& cap, const OffloadConfig& offload,
                     const TrainConfig& train) {
  if (plan_fits(plan, cap, offload)) return;
  const int64_t gpu = plan.gpu_bytes(), pinned = plan.pinned_bytes();
  const int64_t gpu_budget = budget(cap.gpu_total, offload.gpu_memory_fraction);
  const int64_t host_budget = budget(cap.host_available, offload.host_memory_fraction);
  const bool gpu_over = gpu > gpu_budget;
  const bool host_over = cap.host_available > 0 && pinned > host_budget;

  std::string msg = "the offload memory plan does not fit";
  if (gpu_over) {
    msg +=
        strprintf(": the GPU tier needs %s, offload.gpu_memory_fraction=%.2f of %s GPU memory allows %s",
                  gib(gpu).c_str(), offload.gpu_memory_fraction, gib(cap.gpu_total).c_str(), gib(gpu_budget).c_str());
    if (plan.gpu_floor_bytes > gpu_budget)
      msg += std::string(" (weights, gradients") + (plan.layout.nccl_communicators() > 0 ? ", NCCL buffers" : "") +
             " and reserve alone need " + gib(plan.gpu_floor_bytes) +
             (train.precision == Precision::kFp32 ? ": set train.precision=bf16, " : ": ") +
             (plan.layout.stages > 1 || plan.layout.replicas > 1
                  ? "cut the model into more pipeline stages (dist.pipeline_stages) or use GPUs with more memory)"
                  : "this model needs a GPU with more memory, or several GPUs as pipeline stages)");
    std::vector<std::string> fixes = {
        strprintf("a smaller train.micro_batch (now %lld)", (long long)train.micro_batch)};
    if (!plan.checkpointing) fixes.push_back("model.checkpointing=true");
    if (plan.gpu_blocks > 0)
      fixes.push_back(strprintf("a smaller offload.update_split (now %s: %lld of %lld decoder blocks GPU-updated)",
                                offload.update_split.c_str(), (long long)plan.gpu_blocks, (long long)plan.n_layer));
    const std::string last = fixes.back();
    fixes.pop_back();
    msg += "; set " + (fixes.empty() ? last : join(fixes, ", ") + " or " + last);
  }
  if (host_over)
    msg += strprintf(
        "%s the pinned host tier needs %s, offload.host_memory_fraction=%.2f of %s available host memory allows "
        "%s; set %s%s%s%soffload.pin_memory=false, or run with more available host memory",
        gpu_over ? ";" : ":", gib(pinned).c_str(), offload.host_memory_fraction, gib(cap.host_available).c_str(),
        gib(host_budget).c_str(),
        plan.state_bytes == 4   ? "optim.state_dtype=bf16 (half the optimizer states) or int8 (a quarter), "
        : plan.state_bytes == 2 ? "optim.state_dtype=int8 (half the bf16 states), "
                                : "",
        plan.fp32_master ? "optim.master_dtype=bf16 (half the master), " : "",
        plan.host_ring == 0 ? "offload.host_ring=4 (a ring instead of per-block buffers), " : "",
        !plan.nvme_path ? "offload.nvme_path=DIR (the states of the blocks past the host on disk), "
                        : "a larger offload.nvme_blocks (more blocks' states on disk), ");
  msg += " (tandem inspect --plan lists every buffer)";
  TANDEM_FAIL(msg);
}

bool auto_host_ring_allowed(const Config& cfg) {
  const auto& o = cfg.offload;
  if (!o.pin_memory) return false;
  return !(o.delayed_update && cfg.train.grad_accum > 1);  // Note [Delayed host ring]: one micro-batch
}

bool keeps_undo_log(const OffloadConfig& o) {
  if (!o.nvme_path.empty() && o.nvme_blocks != 0) return false;  // Note [NVMe tier]: updates after the norm
  if (o.host_ring > 0) return false;  // a ring's speculative updates are solved back (Note [Retraction])
  return o.speculate != Speculation::kNever && !(o.delayed_update && o.delayed_after == 0);
}

int64_t resolve_nvme_blocks(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_blocks,
                            const MemoryCapacity& cap, const PlanLayout& layout) {
  const auto& o = cfg.offload;
  if (o.nvme_path.empty()) return 0;
  if (o.nvme_blocks >= 0) return o.nvme_blocks;
  if (cap.host_available <= 0 || cap.gpu_total == 0) return 0;  // as resolve_host_ring: no pinned tier to fit
  Config c = cfg;
  // The pinned tier, as plan_fits checks it (the GPU's tier does not change with the disk's).
  const int64_t host_budget = budget(cap.host_available, o.host_memory_fraction);
  const auto fits = [&](int64_t n) {
    c.offload.nvme_blocks = n;
    c.offload.speculate = n == 0 ? o.speculate : Speculation::kNever;  // the tier keeps no undo log
    return plan_offload_memory(spec, c, seq_len, gpu_blocks, layout).pinned_bytes() <= host_budget;
  };
  if (fits(0)) return 0;
  int64_t cpu_blocks = 0;
  for (const auto& b : layout_blocks(spec, layout, gpu_blocks)) cpu_blocks += b.update == UpdateSide::kCpu;
  for (int64_t n = 1; n <= cpu_blocks; ++n)
    if (fits(n)) return n;
  return cpu_blocks;
}

OffloadConfig resolve_host_ring(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_blocks,
                                const MemoryCapacity& cap, const PlanLayout& layout) {
  OffloadConfig o = cfg.offload;
  if (o.host_ring >= 0) return o;
  o.host_ring = 0;
  // Decided on the pinned tier alone; with the CPU as the device (no GPU) there is none.
  if (cap.host_available == 0 || cap.gpu_total == 0 || !auto_host_ring_allowed(cfg)) return o;
  const MemoryPlan plan = plan_offload_memory(spec, cfg, seq_len, gpu_blocks, layout);
  if (plan.pinned_bytes() <= budget(cap.host_available, o.host_memory_fraction)) return o;
  o.host_ring = 4;
  return o;
}

int64_t largest_fitting_gpu_blocks(const ModelSpec& spec, const Config& cfg, int64_t seq_len, const MemoryCapacity& cap,
                                   const PlanLayout& layout) {
  const int64_t gpu_budget = budget(cap.gpu_total, cfg.offload.gpu_memory_fraction);
  // The GPU tier grows with every Block moved to the GPU, so the fitting g are a prefix of 0..L.
  int64_t best = -1;
  for (int64_t g = 0; g <= layout_layers(spec, layout); ++g) {
    if (plan_offload_memory(spec, cfg, seq_len, g, layout).gpu_bytes() > gpu_budget) break;
    best = g;
  }
  return best;
}

namespace {

// The Blocks `pick` takes, consecutive decoder layers as one range: "embedding, layers 0..3".
std::string blocks_where(const MemoryPlan& plan, const std::function<bool(const PlanBlock&)>& pick) {
  std::vector<std::string> out;
  int64_t run_first = -1, run_last = -1;
  const auto flush = [&] {
    if (run_first >= 0) out.push_back(layer_range(run_first, run_last));
    run_first = -1;
  };
  for (const auto& b : plan.blocks) {
    if (!pick(b)) continue;
    if (b.name.rfind("layer.", 0) == 0) {
      const int64_t i = std::stoll(b.name.substr(6));
      if (run_first >= 0 && i == run_last + 1) {
        run_last = i;
      } else {
        flush();
        run_first = run_last = i;
      }
      continue;
    }
    flush();
    out.push_back(b.name);
  }
  flush();
  return out.empty() ? "none" : join(out, ", ");
}

}  // namespace

std::string format_plan(const MemoryPlan& plan) {
  const std::string layout = plan.layout.describe();
  std::string out = strprintf("offload plan: %zu blocks (%lld decoder layers), micro-batch %lld x %lld tokens%s\n",
                              plan.blocks.size(), (long long)plan.n_layer, (long long)plan.micro_batch,
                              (long long)plan.seq_len, layout.empty() ? "" : ("; " + layout).c_str());
  const auto on = [&](UpdateSide side) { return [side](const PlanBlock& b) { return b.update == side; }; };
  out += "  GPU-updated: " + blocks_where(plan, on(UpdateSide::kGpu)) + "\n";
  out += "  CPU-updated: " + blocks_where(plan, on(UpdateSide::kCpu)) + "\n";
  if (plan.nvme_blocks > 0)
    out += "  states on NVMe: " + blocks_where(plan, [](const PlanBlock& b) { return b.nvme; }) + "\n";
  const char* fmt = "  %-14s %-62s %10s\n";
  out += strprintf(fmt, "tier", "purpose", "GiB");
  for (const char* tier : {kTierGpu, kTierPinned, kTierPageable, kTierNvme}) {
    bool any = false;
    for (const auto& r : plan.rows) {
      if (r.tier != tier) continue;
      out += strprintf(fmt, tier, r.purpose.c_str(), strprintf("%.2f", double(r.bytes) / kGiB).c_str());
      any = true;
    }
    if (any) out += strprintf(fmt, tier, "total", strprintf("%.2f", double(plan.tier_bytes(tier)) / kGiB).c_str());
  }
  return out;
}

}  // namespace tandem
