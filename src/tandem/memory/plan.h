#pragma once
// The offload engine's memory plan: every buffer of a training step in offload mode, by tier (GPU,
// pinned host, pageable host), computed before anything is allocated (ARCHITECTURE.md, "One
// training step, offload mode"). Torch-free, so `tandem inspect --plan` and the tests can plan for
// a machine they do not run on.

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/memory/update_side.h"
#include "tandem/models/spec.h"

namespace tandem {

/// GPU memory kept back from the plan's buffers for the CUDA context (about 1.3 GiB on an H100 or
/// H200 with LibTorch's kernels loaded) and the cuBLAS/cuDNN workspaces: a fixed 2 GiB. The caching
/// allocator's fragmentation (5-9 % of the peak on the runs measured) is what
/// offload.gpu_memory_fraction leaves.
inline constexpr int64_t kGpuWorkspaceReserveBytes = int64_t{2} << 30;

/// Names of the tiers in PlanRow::tier.
inline constexpr const char* kTierGpu = "GPU";
inline constexpr const char* kTierPinned = "pinned host";
inline constexpr const char* kTierPageable = "pageable host";
inline constexpr const char* kTierNvme = "NVMe";  ///< files under offload.nvme_path (Note [NVMe tier])

/// Bounce slots of the NVMe tier, each the largest NVMe-tier Block's states (engine/disk_states.h).
inline constexpr int64_t kNvmeBounceSlots = 3;

/// One buffer of the plan (a buffer kind summed over the Blocks that have it).
struct PlanRow {
  std::string tier;     ///< kTierGpu, kTierPinned or kTierPageable
  std::string purpose;  ///< what it holds, e.g. "fp32 master, CPU-updated blocks"
  int64_t bytes = 0;
};

/// GPU memory of one NCCL communicator that carries data: its connection buffers, allocated by
/// NCCL outside the caching allocator (Note [Plan layout]).
inline constexpr int64_t kNcclCommunicatorBytes = int64_t{1} << 30;

/// Note [Plan layout]
/// Where this process's Blocks sit among the run's processes; the default is one process with
/// every Block. A pipeline stage plans its own Blocks only, with the activations of the micro-
/// batches it holds at once under its schedule (1F1B: p - s of them, GPipe: all), and the logits
/// of as many on the last stage; a sharded store (dist.zero_stage=2) holds 1/shards of each
/// Block's master, states and host buffers, and reduce-scatters and all-gathers in place; data
/// parallel and the stage links add NCCL's buffers, a fixed share per communicator that carries
/// data, and the links a send and a receive buffer.
struct PlanLayout {
  /// The model Blocks of this rank's stage, [first, end) in forward order (0 = the embedding,
  /// n_layer + 1 = the head); end < 0 = through the head.
  int64_t first = 0, end = -1;
  int64_t stages = 1, stage = 0;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int64_t micro_batches = 1;  ///< per step (train.grad_accum)
  int64_t replicas = 1;       ///< data-parallel ranks of the stage
  int64_t shards = 1;         ///< ranks sharing each Block's master and states
  bool nccl = false;          ///< GPU collectives through NCCL

  /// Micro-batches whose activations the stage holds at once.
  int64_t in_flight() const;
  /// NCCL communicators that carry data for this rank.
  int64_t nccl_communicators() const;
  /// "stage 1 of 2, 2 replicas, sharded 2 ways" ("" for one process).
  std::string describe() const;
};

/// The layout of world rank `rank` of `world` under `cfg` (dist.zero_stage, train.grad_accum,
/// dist.pipeline_schedule) with the pipeline's stage ends `ends` (empty: no pipeline); `nccl`:
/// CUDA devices with NCCL.
PlanLayout plan_layout(const Config& cfg, int rank, int world, const std::vector<int64_t>& ends, bool nccl);

/// One Block of the model, in forward order.
struct PlanBlock {
  std::string name;  ///< "embedding", "layer.0" .. "layer.<L-1>", "head"
  int64_t params = 0;
  UpdateSide update = UpdateSide::kCpu;
  bool nvme = false;  ///< its states on the NVMe tier (Note [NVMe tier])
};

/// Every buffer of offload training, by tier. Built by plan_offload_memory.
struct MemoryPlan {
  std::vector<PlanRow> rows;      ///< GPU rows first, then host (pinned or pageable), then pageable
  std::vector<PlanBlock> blocks;  ///< embedding, layer.0 .. layer.<L-1>, head
  int64_t gpu_blocks = 0;         ///< decoder Blocks updated on the GPU (the embedding too when > 0)
  int64_t n_layer = 0;
  int64_t micro_batch = 0, seq_len = 0;
  bool checkpointing = false;
  bool pinned = true;           ///< offload.pin_memory: the host buffers are pinned, else pageable
  int64_t gpu_floor_bytes = 0;  ///< GPU weights + gradients + reserve: no batch or split setting lowers it
  int64_t state_bytes = 4;      ///< bytes per host optimizer-state element (optim.state_dtype; int8: 1, scales aside)
  bool fp32_master = true;      ///< optim.master_dtype=fp32: the refusal can name bf16
  int64_t host_ring = 0;        ///< slots of the host ring, 0 = per-block buffers
  int64_t nvme_blocks = 0;      ///< Blocks whose states are on the NVMe tier (the last CPU-updated ones)
  bool nvme_path = false;       ///< offload.nvme_path is set: the refusal names nvme_blocks, else the path
  PlanLayout layout;

  /// Sum of the rows of one tier.
  int64_t tier_bytes(const std::string& tier) const;
  int64_t gpu_bytes() const { return tier_bytes(kTierGpu); }
  int64_t pinned_bytes() const { return tier_bytes(kTierPinned); }
  int64_t pageable_bytes() const { return tier_bytes(kTierPageable); }
};

/// The plan for training `spec` under `cfg` (precision, micro-batch, checkpointing, optimizer state
/// dtype, clipping, accumulation, pin_memory) with sequence length `seq_len` on this rank of
/// `layout`, when the stage's first `gpu_blocks` decoder Blocks (and its embedding, if it holds it
/// and gpu_blocks > 0) are updated on the GPU and every other Block, the head always, on the CPU.
/// gpu_blocks must be in [0, the stage's decoder layers]; offload.host_ring = -1 (auto) plans
/// per-block buffers, as resolve_host_ring starts from.
MemoryPlan plan_offload_memory(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_blocks,
                               const PlanLayout& layout = {});

/// Note [Activation offload]: how many of Blocks [first, end) are decoder layers among the first
/// `activation_offload` (-1: all) whose activations go to the host.
int64_t offloaded_layers(const ModelSpec& spec, int64_t activation_offload, int64_t first, int64_t end);
/// The host bytes those layers' saved tensors take (the plan's host row; the run reserves them,
/// Note [Activation host arena]).
int64_t offloaded_activation_bytes(const ModelSpec& spec, const Config& cfg, int64_t seq_len,
                                   const PlanLayout& layout = {});
/// The decoder layers among the layout's Blocks.
int64_t layout_layers(const ModelSpec& spec, const PlanLayout& layout);
/// The layout's Blocks in forward order, the first `gpu_blocks` decoder layers (and the embedding
/// with them) GPU-updated; and their parameter count.
std::vector<PlanBlock> layout_blocks(const ModelSpec& spec, const PlanLayout& layout, int64_t gpu_blocks);
int64_t layout_params(const ModelSpec& spec, const PlanLayout& layout);

/// Memory of the machine a plan must fit, in bytes.
struct MemoryCapacity {
  int64_t gpu_total = 0;       ///< the GPU's total memory
  int64_t host_available = 0;  ///< MemAvailable of the host; 0 = unknown, the pinned tier is not checked
};

/// Note [Host memory guard]
/// The host memory guard: when the pinned rows would exceed offload.host_memory_fraction of the
/// available host memory but the same buffers fit the available memory as pageable ones, returns
/// the pageable plan and sets offload->pin_memory=false, with the warning to give in *why (the
/// cost: every copy staged through the driver's pinned bounce buffer, about half the bandwidth,
/// and less overlap with compute). Otherwise returns `plan` unchanged.
MemoryPlan guard_pinned_memory(const MemoryPlan& plan, const ModelSpec& spec, Config& cfg, int64_t seq_len,
                               int64_t gpu_blocks, const MemoryCapacity& capacity, std::string* why);  // plan.layout

/// Whether the plan's GPU rows fit offload.gpu_memory_fraction x gpu_total and its pinned rows fit
/// offload.host_memory_fraction x host_available (not checked when host_available is 0).
bool plan_fits(const MemoryPlan& plan, const MemoryCapacity& capacity, const OffloadConfig& offload);

/// UserError, one message with the numbers and what to change, when the GPU rows exceed
/// offload.gpu_memory_fraction x gpu_total or the pinned rows exceed offload.host_memory_fraction x
/// host_available.
void check_plan_fits(const MemoryPlan& plan, const MemoryCapacity& capacity, const OffloadConfig& offload,
                     const TrainConfig& train);

/// Whether the configuration lets offload.host_ring=auto choose a ring (Note [Host ring]): pinned
/// host buffers and no delayed update that accumulates (Note [Delayed host ring]). The CLI's plan
/// and the Python engine's both ask it.
bool auto_host_ring_allowed(const Config& cfg);

/// Whether CPU updates may speculate and so keep an undo log (Note [Speculative clipping]): not with
/// offload.speculate=never, nor with a delayed update from the first step on (it waits for the norm),
/// nor with a host ring (offload.host_ring > 0), whose speculative updates are solved back instead
/// (Note [Retraction]); an unresolved ring (auto) is counted by whoever resolves it.
bool keeps_undo_log(const OffloadConfig& offload);

/// offload.host_ring = -1 resolved for a plan at `gpu_blocks`: per-block buffers (0) when that plan's
/// pinned tier fits (or the host is unknown), else a ring of 4 slots (whose speculative updates are
/// solved back, Note [Retraction]); pageable buffers, or a delayed update that accumulates, keep
/// per-block buffers. Other values as set.
OffloadConfig resolve_host_ring(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_blocks,
                                const MemoryCapacity& capacity, const PlanLayout& layout = {});

/// offload.nvme_blocks resolved for a plan at `gpu_blocks` (Note [NVMe tier]): 0 without
/// offload.nvme_path; as set when >= 0; auto (-1): the fewest of the last CPU-updated Blocks whose
/// states on the NVMe tier make the pinned host tier fit (0 when the host is unknown or fits, or
/// the CPU is the device; every
/// CPU-updated Block when nothing fits, for check_plan_fits to refuse).
int64_t resolve_nvme_blocks(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_blocks,
                            const MemoryCapacity& capacity, const PlanLayout& layout = {});

/// The largest number of GPU-updated decoder Blocks of the layout's whose plan's GPU tier fits
/// offload.gpu_memory_fraction x capacity.gpu_total; -1 when not even 0 fits.
int64_t largest_fitting_gpu_blocks(const ModelSpec& spec, const Config& cfg, int64_t seq_len,
                                   const MemoryCapacity& capacity, const PlanLayout& layout = {});

/// The plan as a table: tier, purpose, GiB per row and a total per tier, under one line naming the
/// Blocks and their update side.
std::string format_plan(const MemoryPlan& plan);

}  // namespace tandem
