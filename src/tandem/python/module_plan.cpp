#include "tandem/python/module_plan.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/memory/plan.h"

namespace tandem {

// Note [Module plan]
// The CLI plans from the architecture (memory/plan); for a user's model the engine knows the
// Blocks' sizes only.
//   Host: masters, m, v, landing, staging and undo buffers per parameter of a CPU-updated Block,
//     so the split comes first and the host counts the Blocks after it (with the CPU as the device,
//     the device side's masters, states, weights and gradients too: they are host memory). As the
//     CLI measures the host before it builds the model, the user's parameters on the host count as
//     available: the store frees each Block's as it binds them (unless offload.host_memory_gib
//     says how much there is). When the CPU-updated Blocks' per-Block buffers do not fit
//     offload.host_memory_fraction of this rank's share, offload.host_ring=auto takes a ring of
//     4 slots (Note [Host ring]) where the configuration allows one, by the CLI's rule
//     (auto_host_ring_allowed: pinned buffers, no delayed update that
//     accumulates); with offload.nvme_path, offload.nvme_blocks=auto then takes the fewest of the
//     last Blocks whose moments on the NVMe tier make the host fit (Note [NVMe tier]); below the
//     masters and states alone (the masters alone, with the tier) nothing fits. The fewest
//     GPU-updated Blocks whose host side fits is the solver's lower bound, as in the CLI.
//   Device: the working weights and gradients in the compute dtype, and 12 bytes per parameter
//     (fp32 master, m, v; 8 with bf16 device states, Note [Device Adam]) of each GPU-updated
//     Block. A third of the GPU is kept for activations and
//     workspace, a guess; the first split is the largest prefix that fits beside them
//     (offload.update_split=auto) or the user's k.
//   Measured: the peak is reset at the engine's first forward (the build's transients do not
//     count) and read after its second step; the range grows to what the peak left free of
//     offload.gpu_memory_fraction of the GPU (the CLI plan's share), and the solver at step 3
//     chooses within it.

namespace {

constexpr double kActivationShare = 1.0 / 3.0;  // of the GPU, kept for activations at first
constexpr int64_t kAutoRingSlots = 4;

// A GPU-updated Block's bytes per parameter on the device: its fp32 master, m and v (fp32 or bf16,
// Note [Device Adam]).
double gpu_state_bytes(const Config& cfg) {
  return 4.0 + 2.0 * double(device_state_bytes(cfg.optim.device_state_dtype, cfg.optim.state_dtype));
}

// The most Blocks from `first` on whose GPU states (`per_param` bytes a parameter) fit `room` bytes.
int64_t blocks_fitting(const ModuleBlocks& blocks, int64_t first, double room, double per_param) {
  const int64_t n = static_cast<int64_t>(blocks.block_count());
  int64_t top = first;
  while (top < n) {
    room -= per_param * double(blocks.block_numel(static_cast<size_t>(top)));
    if (room < 0) break;
    ++top;
  }
  return top;
}

// Host bytes per parameter (Note [Module plan]).
struct HostBytesPerParam {
  double master = 0;          // master (fp32 or bf16) of a CPU-updated Block
  double moments = 0;         // its m and v (on the NVMe tier instead for the last Blocks: Note [NVMe tier])
  double buffers = 0;         // its gradient landing and weight staging (per Block, or per ring slot)
  double undo = 0;            // its undo log (speculative updates, per-Block buffers only)
  double device_states = 0;   // the CPU as the device: a GPU-updated Block's master, m, v
  double device_working = 0;  // the CPU as the device: every Block's working weights and gradients
};

HostBytesPerParam host_bytes_per_param(const Config& cfg, bool device_is_host) {
  const double state = double(state_buffer_bytes(cfg.optim.state_dtype, 1 << 20)) / double(1 << 20);
  const double compute = cfg.train.precision == Precision::kFp32 ? 4 : 2;
  const double landing = cfg.train.precision == Precision::kBf16 ? 2 : 4;  // fp16 gradients land widened
  const bool undo = keeps_undo_log(cfg.offload);
  HostBytesPerParam b;
  b.master = double(master_bytes(cfg.optim.master_dtype, cfg.optim.master_rounding));
  b.moments = 2 * state;
  b.buffers = landing + compute;
  b.undo = undo ? b.master + b.moments : 0;
  b.device_states = device_is_host ? gpu_state_bytes(cfg) : 0;
  b.device_working = device_is_host ? 2 * compute : 0;
  return b;
}

// The host bytes of the plan with the first `gpu_blocks` Blocks GPU-updated, `ring` slots (0 =
// per-Block buffers) and the moments of the last `nvme` CPU-updated Blocks on the NVMe tier (with
// its bounce slots); the masters, states and buffers are shared by `shards` ranks.
double host_bytes(const ModuleBlocks& blocks, int64_t gpu_blocks, int64_t ring, int64_t nvme,
                  const HostBytesPerParam& b, int shards) {
  double bytes = 0, largest = 0, largest_nvme = 0;
  const auto count = static_cast<int64_t>(blocks.block_count());
  for (int64_t i = 0; i < count; ++i) {
    const double numel = double(blocks.block_numel(static_cast<size_t>(i))), shard = numel / double(shards);
    largest = std::max(largest, shard);
    const bool gpu = i < gpu_blocks, on_disk = !gpu && i >= count - nvme;
    if (on_disk) largest_nvme = std::max(largest_nvme, shard);
    const double cpu = b.master + (on_disk ? 0 : b.moments) + (ring == 0 ? b.buffers + b.undo : 0);
    bytes += b.device_working * numel + shard * (gpu ? b.device_states : cpu);
  }
  return bytes + double(ring) * largest * b.buffers + double(kNvmeBounceSlots) * largest_nvme * b.moments;
}

}  // namespace

int64_t plan_module_host(Config& cfg, const ModuleBlocks& blocks, const HostShare& host, int64_t gpu_blocks) {
  auto& o = cfg.offload;
  const bool tier = !o.nvme_path.empty();  // Note [NVMe tier]
  const auto count = static_cast<int64_t>(blocks.block_count());
  if (!tier) o.nvme_blocks = 0;
  Config without_tier = cfg;
  without_tier.offload.nvme_blocks = 0;
  const HostBytesPerParam per = host_bytes_per_param(without_tier, host.device_is_host);
  HostBytesPerParam floor_per = per;  // masters and states: a ring cannot shrink them, the tier the moments
  floor_per.buffers = floor_per.undo = 0;
  const double room = double(host.available) + double(host.reclaimable);
  const double floor = host_bytes(blocks, gpu_blocks, 0, tier ? count : 0, floor_per, host.shards);
  TANDEM_CHECK(floor <= room, "the host cannot hold the masters", tier ? "" : " and Adam states", ": ",
               format_bytes(floor), " needed, ", format_bytes(room),
               " available; set optim.state_dtype=bf16 or int8, optim.master_dtype=bf16, ",
               tier ? "" : "offload.nvme_path=DIR (Adam states on disk), ",
               "run on more ranks with dist.zero_stage=2, or use a host with more memory");
  const double budget = o.host_memory_fraction * room;
  const auto fits = [&](int64_t g, int64_t ring, int64_t nvme, const HostBytesPerParam& p) {
    return host_bytes(blocks, g, ring, nvme, p, host.shards) <= budget;
  };
  const int64_t nvme0 = std::max<int64_t>(o.nvme_blocks, 0);
  if (o.host_ring < 0) {
    o.host_ring = fits(gpu_blocks, 0, nvme0, per) || !auto_host_ring_allowed(cfg) ? 0 : kAutoRingSlots;
    if (o.host_ring > 0) {
      log::info(strprintf(
          "offload: per-block host buffers (%s) do not fit offload.host_memory_fraction=%.2f of the "
          "host (%s); a ring of %lld slots instead, no undo log (offload.host_ring=auto)",
          format_bytes(host_bytes(blocks, gpu_blocks, 0, nvme0, per, host.shards)).c_str(), o.host_memory_fraction,
          format_bytes(room).c_str(), static_cast<long long>(kAutoRingSlots)));
    }
  }
  HostBytesPerParam no_undo = per;
  no_undo.undo = 0;
  if (tier && o.nvme_blocks < 0) {  // auto: the fewest of the last Blocks that make the host fit
    o.nvme_blocks = 0;
    if (!fits(gpu_blocks, o.host_ring, 0, per)) {
      o.nvme_blocks = count;
      for (int64_t n = 1; n < count; ++n)
        if (fits(gpu_blocks, o.host_ring, n, no_undo)) {
          o.nvme_blocks = n;
          break;
        }
      log::info(strprintf("offload: the host holds the states of all but the last %lld blocks; theirs go to the "
                          "NVMe tier in %s, updates after the norm (offload.nvme_blocks=auto, Note [NVMe tier])",
                          static_cast<long long>(o.nvme_blocks), o.nvme_path.c_str()));
    }
  }
  if (o.nvme_blocks > 0) o.speculate = Speculation::kNever;  // no undo log on disk
  const HostBytesPerParam& final_per = o.nvme_blocks > 0 ? no_undo : per;
  int64_t lo = gpu_blocks;
  while (lo > 0 && fits(lo - 1, o.host_ring, o.nvme_blocks, final_per)) --lo;
  return lo;
}

std::pair<int64_t, int64_t> plan_module_split(const Config& cfg, const ModuleBlocks& blocks,
                                              const c10::Device& device) {
  const int64_t n = static_cast<int64_t>(blocks.block_count());
  int64_t limit = n;
  if (device.is_cuda() && accelerator()) {
    const auto mem = accelerator()->memory_stats(device.index());
    const int64_t compute = cfg.train.precision == Precision::kFp32 ? 4 : 2;
    limit = blocks_fitting(
        blocks, 0,
        double(mem.free) - double(mem.total) * kActivationShare - 2.0 * double(compute) * double(blocks.numel()),
        gpu_state_bytes(cfg));
  }
  const auto k = parse_update_split(cfg.offload.update_split);
  if (!k) return {limit, limit};
  // k counts decoder layers, as in the CLI: the prefix through the round(k * layers)-th layer.
  int64_t layers = 0;
  for (int64_t i = 0; i < n; ++i) layers += blocks.block_kind(static_cast<size_t>(i)) == BlockKind::kLayer;
  const int64_t want = std::llround(*k * double(layers));
  int64_t prefix = 0, seen = 0;
  while (prefix < n && seen < want) seen += blocks.block_kind(static_cast<size_t>(prefix++)) == BlockKind::kLayer;
  TANDEM_CHECK(prefix <= limit, "offload.update_split=", cfg.offload.update_split, " puts ", prefix,
               " Blocks' fp32 masters and states on the GPU, but ", limit,
               " fit beside the working weights and activations; lower offload.update_split or set it to auto");
  return {prefix, limit};
}

int64_t measured_split_limit(const Config& cfg, const ModuleBlocks& blocks, int64_t gpu_blocks, int device_index) {
  const auto mem = accelerator()->memory_stats(device_index);
  const int64_t top = blocks_fitting(
      blocks, gpu_blocks, double(mem.total) * cfg.offload.gpu_memory_fraction - double(mem.peak_allocated),
      gpu_state_bytes(cfg));
  log::info(strprintf("offload: peak GPU memory %s of %s: the split may put up to %lld of %zu Blocks on the GPU",
                      format_bytes(double(mem.peak_allocated)).c_str(), format_bytes(double(mem.total)).c_str(),
                      static_cast<long long>(top), blocks.block_count()));
  return top;
}

}  // namespace tandem
