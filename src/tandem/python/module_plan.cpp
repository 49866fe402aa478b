#include "tandem/python/module_plan.h"

#include <cmath>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"

namespace tandem {

// Note [Module plan]
// The CLI plans from the architecture (memory/plan); for a user's model the engine knows the
// Blocks' sizes only.
//   Host: masters, m, v, landing, staging and undo buffers per parameter of a CPU-updated Block.
//     When they do not fit this rank's share of the host, offload.host_ring=auto takes a ring of
//     4 slots (Note [Host ring]); below the masters and states alone nothing fits.
//   Device: the working weights and gradients in the compute dtype, and 12 bytes per parameter
//     (fp32 master, m, v) of each GPU-updated Block. A third of the GPU is kept for activations and
//     workspace, a guess; the first split is the largest prefix that fits beside them
//     (offload.update_split=auto) or the user's k.
//   Measured: after two steps the peak is known; the range grows to what the peak left free (8%
//     kept for the allocator), and the solver at step 3 chooses within it.

namespace {

constexpr double kActivationShare = 1.0 / 3.0;  // of the GPU, kept for activations at first
constexpr int64_t kAutoRingSlots = 4;
constexpr double kPeakMargin = 0.92;     // of the GPU, usable once the peak is measured
constexpr double kGpuStateBytes = 12.0;  // fp32 master, m and v per parameter of a GPU-updated Block

// The most Blocks from `first` on whose GPU states fit `room` bytes.
int64_t blocks_fitting(const ModuleBlocks& blocks, int64_t first, double room) {
  const int64_t n = static_cast<int64_t>(blocks.block_count());
  int64_t top = first;
  while (top < n) {
    room -= kGpuStateBytes * double(blocks.block_numel(static_cast<size_t>(top)));
    if (room < 0) break;
    ++top;
  }
  return top;
}

}  // namespace

void plan_module_host(Config& cfg, const ModuleBlocks& blocks, int64_t host_bytes, int shards) {
  const int64_t state = cfg.optim.state_dtype == StateDtype::kBf16 ? 2 : 4;
  const int64_t compute = cfg.train.precision == Precision::kFp32 ? 4 : 2;
  const bool undo = cfg.offload.speculate != Speculation::kNever && !cfg.offload.delayed_update;
  const double numel = double(blocks.numel()) / double(shards);
  const double floor = double(4 + 2 * state) * numel;  // masters and states: a ring cannot shrink them
  TANDEM_CHECK(floor <= double(host_bytes),
               "the host cannot hold the fp32 masters and Adam states: ", format_bytes(floor), " needed, ",
               format_bytes(double(host_bytes)),
               " available; set optim.state_dtype=bf16, run on more ranks with dist.zero_stage=2, or use a host "
               "with more memory");
  if (cfg.offload.host_ring >= 0) return;
  const double need = double(4 + 2 * state + 2 * compute + (undo ? 4 + 2 * state : 0)) * numel;
  cfg.offload.host_ring = need <= 0.9 * double(host_bytes) ? 0 : kAutoRingSlots;
  if (cfg.offload.host_ring == 0) return;
  cfg.offload.speculate = Speculation::kNever;
  log::info(strprintf(
      "offload: per-block host buffers (%s) do not fit the host (%s); a ring of %lld slots instead, "
      "updates after the norm (offload.host_ring=auto)",
      format_bytes(need).c_str(), format_bytes(double(host_bytes)).c_str(), static_cast<long long>(kAutoRingSlots)));
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
        double(mem.free) - double(mem.total) * kActivationShare - 2.0 * double(compute) * double(blocks.numel()));
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

int64_t measured_split_limit(const ModuleBlocks& blocks, int64_t gpu_blocks, int device_index) {
  const auto mem = accelerator()->memory_stats(device_index);
  const int64_t top = blocks_fitting(blocks, gpu_blocks, double(mem.total) * kPeakMargin - double(mem.peak_allocated));
  log::info(strprintf("offload: peak GPU memory %s of %s: the split may put up to %lld of %zu Blocks on the GPU",
                      format_bytes(double(mem.peak_allocated)).c_str(), format_bytes(double(mem.total)).c_str(),
                      static_cast<long long>(top), blocks.block_count()));
  return top;
}

}  // namespace tandem
