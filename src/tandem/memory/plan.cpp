#include "tandem/memory/plan.h"

#include <algorithm>

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

MemoryPlan plan_offload_memory(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_blocks) {
  const int64_t L = spec.n_layer;
  TANDEM_ASSERT(gpu_blocks >= 0 && gpu_blocks <= L, "gpu_blocks ", gpu_blocks, " outside [0, ", L, "]");
  TANDEM_ASSERT(seq_len > 0, "seq_len ", seq_len);

  MemoryPlan plan;
  plan.gpu_blocks = gpu_blocks;
  plan.n_layer = L;
  plan.micro_batch = cfg.train.micro_batch;
  plan.seq_len = seq_len;
  plan.checkpointing = cfg.model.checkpointing;
  plan.pinned = cfg.offload.pin_memory;

  // Blocks in forward order. The head owns the final norm and, when untied, the lm_head; a tied
  // lm_head is the embedding's matrix and is counted there.
  const int64_t emb = spec.padded_vocab() * spec.d_model;
  int64_t layers = 0;
  for (int64_t i = 0; i < L; ++i) layers += spec.layer_params(i);
  const int64_t head = spec.num_params() - emb - layers;
  const auto side = [&](bool gpu) { return gpu ? UpdateSide::kGpu : UpdateSide::kCpu; };
  plan.blocks.push_back({"embedding", emb, side(gpu_blocks > 0)});
  for (int64_t i = 0; i < L; ++i)
    plan.blocks.push_back({"layer." + std::to_string(i), spec.layer_params(i), side(i < gpu_blocks)});
  plan.blocks.push_back({"head", head, UpdateSide::kCpu});

  int64_t n_all = 0, n_gpu = 0, n_cpu = 0;
  for (const auto& b : plan.blocks) {
    n_all += b.params;
    (b.update == UpdateSide::kGpu ? n_gpu : n_cpu) += b.params;
  }
  TANDEM_ASSERT(n_all == spec.num_params(), "blocks hold ", n_all, " parameters, the spec ", spec.num_params());

  const int64_t w = working_bytes(cfg.train.precision);
  const int64_t s = cfg.optim.state_dtype == StateDtype::kBf16 ? 2 : 4;
  plan.state_bytes = s;
  const std::string wt = to_string(cfg.train.precision);
  const std::string st = to_string(cfg.optim.state_dtype);
  const std::string host = plan.pinned ? kTierPinned : kTierPageable;
  auto add = [&](const std::string& tier, std::string purpose, int64_t bytes) {
    plan.rows.push_back({tier, std::move(purpose), bytes});
  };

  // GPU: every Block's working weights and .grad buffers; master and states of the GPU-updated
  // Blocks; what autograd saves for backward; the reserve.
  add(kTierGpu, "working weights (" + wt + "), all blocks", n_all * w);
  add(kTierGpu, "gradients (" + wt + "), all blocks", n_all * w);
  if (gpu_blocks > 0) {
    add(kTierGpu, "fp32 master, GPU-updated blocks", 4 * n_gpu);
    add(kTierGpu, "optimizer states m, v (fp32), GPU-updated blocks", 2 * 4 * n_gpu);
  }
  const auto e =
      estimate_training_memory(spec, cfg.train.micro_batch, seq_len, cfg.train.precision, cfg.model.checkpointing);
  add(kTierGpu, std::string("activations (checkpointing ") + (cfg.model.checkpointing ? "on)" : "off)"), e.activations);
  add(kTierGpu, "logits and loss", e.logits);
  add(kTierGpu, "allocator and workspace reserve", kGpuWorkspaceReserveBytes);
  plan.gpu_floor_bytes = 2 * n_all * w + kGpuWorkspaceReserveBytes;

  // Host: the CPU-updated Blocks' optimizer side (the head is always one, so these rows always exist).
  add(host, "fp32 master, CPU-updated blocks", 4 * n_cpu);
  add(host, "optimizer states m, v (" + st + "), CPU-updated blocks", 2 * s * n_cpu);
  // The CPU kernels read bf16 or fp32 gradients: fp16 ones land widened to fp32.
  const bool bf16 = cfg.train.precision == Precision::kBf16;
  const std::string gt = bf16 ? "bf16" : "fp32";
  const int64_t g = bf16 ? 2 : 4;
  const int64_t ring = std::max<int64_t>(cfg.offload.host_ring, 0);  // auto plans per-block buffers
  plan.host_ring = ring;
  if (ring == 0) {
    add(host, "gradient landing buffers (" + gt + ")", n_cpu * g);
    add(host, "weight staging buffers (" + wt + ")", n_cpu * w);
  } else {
    int64_t largest = 0;
    for (const auto& b : plan.blocks) largest = std::max(largest, b.params);
    add(host, strprintf("gradient landing ring (%lld slots, %s)", (long long)ring, gt.c_str()), ring * largest * g);
    add(host, strprintf("weight staging ring (%lld slots, %s)", (long long)ring, wt.c_str()), ring * largest * w);
  }
  // Speculative updates keep an undo log for the clipping and non-finite rollbacks (even without
  // clipping: a non-finite gradient rolls back too).
  if (ring == 0 && cfg.offload.speculate != Speculation::kNever && !cfg.offload.delayed_update)
    add(host, "undo log (speculative updates)", (4 + 2 * s) * n_cpu);

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
  MemoryPlan pp = plan_offload_memory(spec, pageable, seq_len, gpu_blocks);
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
      msg += " (weights, gradients and reserve alone need " + gib(plan.gpu_floor_bytes) +
             (train.precision == Precision::kFp32 ? ": set train.precision=bf16 or use a GPU with more memory)"
                                                  : ": this model needs a GPU with more memory)");
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
        "%s; set %s%soffload.pin_memory=false, or run with more available host memory",
        gpu_over ? ";" : ":", gib(pinned).c_str(), offload.host_memory_fraction, gib(cap.host_available).c_str(),
        gib(host_budget).c_str(), plan.state_bytes == 4 ? "optim.state_dtype=bf16 (half the optimizer states), " : "",
        plan.host_ring == 0 && offload.speculate != Speculation::kAlways
            ? "offload.host_ring=4 (a ring instead of per-block buffers), "
            : "");
  msg += " (tandem inspect --plan lists every buffer)";
  TANDEM_FAIL(msg);
}

bool auto_host_ring_allowed(const Config& cfg) {
  const auto& o = cfg.offload;
  if (!o.pin_memory || o.speculate == Speculation::kAlways) return false;
  return !(o.delayed_update && cfg.train.grad_accum > 1);  // Note [Delayed host ring]: one micro-batch
}

OffloadConfig resolve_host_ring(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_blocks,
                                const MemoryCapacity& cap) {
  OffloadConfig o = cfg.offload;
  if (o.host_ring >= 0) return o;
  o.host_ring = 0;
  // Decided on the pinned tier alone; with the CPU as the device (no GPU) there is none.
  if (cap.host_available == 0 || cap.gpu_total == 0 || !auto_host_ring_allowed(cfg)) return o;
  const MemoryPlan plan = plan_offload_memory(spec, cfg, seq_len, gpu_blocks);
  if (plan.pinned_bytes() <= budget(cap.host_available, o.host_memory_fraction)) return o;
  o.host_ring = 4;
  o.speculate = Speculation::kNever;
  return o;
}

int64_t largest_fitting_gpu_blocks(const ModelSpec& spec, const Config& cfg, int64_t seq_len,
                                   const MemoryCapacity& cap) {
  const int64_t gpu_budget = budget(cap.gpu_total, cfg.offload.gpu_memory_fraction);
  // The GPU tier grows with every Block moved to the GPU, so the fitting g are a prefix of 0..L.
  int64_t best = -1;
  for (int64_t g = 0; g <= spec.n_layer; ++g) {
    if (plan_offload_memory(spec, cfg, seq_len, g).gpu_bytes() > gpu_budget) break;
    best = g;
  }
  return best;
}

std::string format_plan(const MemoryPlan& plan) {
  const int64_t L = plan.n_layer, g = plan.gpu_blocks;
  std::string out =
      strprintf("offload plan: %lld blocks (embedding, %lld decoder layers, head), micro-batch %lld x %lld tokens\n",
                (long long)(L + 2), (long long)L, (long long)plan.micro_batch, (long long)plan.seq_len);
  out += "  GPU-updated: " + (g > 0 ? "embedding, " + layer_range(0, g - 1) : std::string("none")) + "\n";
  out += "  CPU-updated: " + (g > 0 ? std::string() : std::string("embedding, ")) +
         (g < L ? layer_range(g, L - 1) + ", " : std::string()) + "head\n";
  const char* fmt = "  %-14s %-52s %10s\n";
  out += strprintf(fmt, "tier", "purpose", "GiB");
  for (const char* tier : {kTierGpu, kTierPinned, kTierPageable}) {
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
