#pragma once
// The offload engine's single source of weights: per Block, flat buffers on each tier and the
// module's parameters rebound as views of them (ARCHITECTURE.md, "One training step, offload mode").
//
// Note [ParamStore layout]
// Each Block's parameters (its hf_parameters(), so a tied head owns none) are laid end to end in
// one flat range of `numel` elements, in a fixed order:
//   device  working (numel) compute dtype   the module's parameters are views of it
//           grad    (numel) compute dtype   the parameters' .grad are views of it, so autograd
//                                           accumulates straight into one flat buffer per Block
//   master  (numel) fp32, m and v (numel): pinned host memory for CPU-updated Blocks (m and v in
//           fp32, bf16 or 8 bits, optim.state_dtype; the master in fp32, or in bf16 with
//           optim.master_dtype=bf16 and, rounded by Kahan's compensation, a bf16 master_comp: Note
//           [bf16 master]), device memory in fp32 for GPU-updated ones (Note [Update split])
//   host    landing (numel) bf16 or fp32    gradients coming down (CPU-updated Blocks)
//           staging (numel) compute dtype   new weights going up (CPU-updated Blocks)
//           undo    master, m, v copies     speculative clipping (Note [Speculative clipping])
// With a host ring (Note [Host ring]) landing and staging are not per Block: a few slots, each the
// size of the largest Block, are shared by the CPU-updated Blocks in turn. With the NVMe tier (Note
// [NVMe tier]) the last Blocks' m and v live in files (engine/disk_states.h) while they are
// CPU-updated: undefined here between updates, bound to a bounce slot during one, and paged in by
// whatever else reads or writes them.
// One flat range per Block is also the seam for sharding (Note [Sharded store]). With the CPU as the
// device, "device" and "pinned host" are both plain host memory and the copies are memcpy.
//
// Note [Sharded store]
// With shard_count = W > 1 (ZeRO-style, dist.zero_stage=2) each Block's range is padded to a
// multiple of W and rank r owns the slice [r * n/W, (r+1) * n/W): its master, m, v, landing,
// staging and undo buffers hold only that slice, and `shard_params` lists the parameters' pieces in
// it (offsets relative to the slice). The working weights and the gradient stay whole on the
// device: the gradient is reduce-scattered into `grad_shard` (in place under NCCL: the gradient's
// own slice), the slice is updated, its new weights are written into the working copy's slice and
// all-gathered (gather_working, in place under NCCL too). W = 1 is the
// unsharded store: the slice is the whole range and shard_params == params.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/engine/disk_states.h"
#include "tandem/engine/host_masters.h"
#include "tandem/memory/update_side.h"
#include "tandem/models/block_sequence.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/parallel/comm.h"

namespace tandem {

/// One parameter inside a Block's flat range.
struct FlatParam {
  std::string name;     ///< HF name
  torch::Tensor param;  ///< the module's parameter (a view of `working`)
  int64_t offset = 0, numel = 0;
  std::vector<int64_t> shape;
  float weight_decay_scale = 1.0f;  ///< 0 for 1-D parameters (norm scales), as FusedAdamW
  int group = -1;                   ///< its parameter group (Note [Parameter groups]); -1: none
  int64_t scale_offset = 0;         ///< 8-bit states: its first scale (shard_params only; Note [8-bit states])
};

/// The buffers of one Block (Note [ParamStore layout]).
struct BlockStore {
  std::string name;
  std::vector<FlatParam> params;
  int64_t numel = 0;
  /// This rank's slice (Note [Sharded store]): [shard_offset, shard_offset + shard_numel) of the
  /// range padded to padded_numel; shard_params' offsets are relative to the slice.
  int64_t shard_offset = 0, shard_numel = 0, padded_numel = 0;
  std::vector<FlatParam> shard_params;
  int64_t index_base = 0;  ///< offset of this Block in the whole parameter space (stochastic rounding)
  UpdateSide side = UpdateSide::kCpu;
  torch::Tensor working, grad;  // (padded_numel) compute dtype, device
  torch::Tensor grad_shard;     // (shard_numel) compute dtype, device; sharded stores only (NCCL: a view of grad)
  torch::Tensor master, m,
      v;  // (shard_numel) pinned host (kCpu: the host master and state dtypes) or device (kGpu, fp32)
  torch::Tensor master_comp;  // (shard_numel) bf16, host: a bf16 master's Kahan compensation (engine/host_masters.h)
  torch::Tensor m_scale, v_scale;  // 8-bit host states (engine/host_states.h): a scale per 2048 of each slice
  torch::Tensor landing, staging;  // (shard_numel) bf16/fp32 and compute dtype, pinned host; once CPU-updated (no ring)
  torch::Tensor undo_master, undo_m, undo_v;  // (shard_numel) host, as master, m, v; kCpu with speculation only
  torch::Tensor undo_master_comp;             // and the compensation
  torch::Tensor undo_m_scale, undo_v_scale;   // and the scales of 8-bit states
  /// Note [Block placement]: the module's parameters are views of staging (weights) and landing
  /// (gradients) on the host, so the Block runs on the CPU; false: views of working and grad.
  bool host_run = false;
  /// Note [NVMe tier]: the Block's file on the tier (-1: none) and whether its states live there
  /// while it is CPU-updated (then m, v and their scales are undefined between updates).
  int nvme_file = -1;
  bool nvme = false;
  /// Updates of the master not yet in the device working copy (a host-run Block's mirror is
  /// refreshed when it next runs on the device; EngineOptions::mirror_every).
  int64_t mirror_lag = 0;
};

struct ParamStoreOptions {
  torch::Device device = torch::kCPU;
  torch::ScalarType compute_dtype = torch::kFloat32;  ///< working weights and gradients
  bool pin_memory = true;                             ///< pinned host buffers (ignored when the device is the CPU)
  bool undo = true;  ///< keep undo buffers for speculative updates of CPU-updated Blocks
  /// m and v of CPU-updated Blocks: kFloat32, kBFloat16 (half the host memory; the CPU kernels
  /// round them as optim.state_rounding says) or kInt8 (8-bit codes, Note [8-bit states]).
  torch::ScalarType host_state_dtype = torch::kFloat32;
  /// m and v of GPU-updated Blocks: kFloat32 or kBFloat16 (Note [Device Adam]).
  torch::ScalarType device_state_dtype = torch::kFloat32;
  /// The master of CPU-updated Blocks (Note [bf16 master]); GPU-updated Blocks keep fp32.
  MasterKind host_master = MasterKind::kFp32;
  /// 0: landing and staging buffers per CPU-updated Block; N > 0: a ring of N shared slots
  /// (Note [Host ring]); needs updates that start after the norm is known (no undo log).
  int64_t ring_slots = 0;
  /// Note [Sharded store]: this rank and the number of ranks sharing the masters and states, and
  /// the groups that gather the working weights (required when shard_count > 1).
  int shard_rank = 0, shard_count = 1;
  Comm* comm = nullptr;
  bool decay_1d = false;  ///< optim.decay_1d: 1-D parameters decay too (else weight_decay_scale 0)
  /// Note [NVMe tier]: the states of the last `nvme_blocks` Blocks live in files under `nvme_path`
  /// while CPU-updated (no undo log then).
  std::string nvme_path;
  int64_t nvme_blocks = 0;
};

/// One slot of the host ring: a landing and a staging buffer the size of the largest Block.
struct RingSlot {
  torch::Tensor landing, staging;
};

/// Owns every Block's flat buffers and keeps the module's parameters bound to them.
class ParamStore {
 public:
  /// Takes the model's current (fp32) parameters as the masters, then binds the parameters
  /// to device working copies. Blocks [0, gpu_blocks) are GPU-updated, the rest CPU-updated.
  /// gpu_blocks() counts the GPU-updated Blocks.
  ParamStore(BlockSequence& model, ParamStoreOptions options, int64_t gpu_blocks);

  std::vector<BlockStore>& blocks() { return blocks_; }
  std::vector<RingSlot>& ring() { return ring_; }
  /// Block i's landing and staging buffers: its own, or ring slot `slot`'s first numel elements.
  torch::Tensor landing(size_t i, int64_t slot) const;
  torch::Tensor staging(size_t i, int64_t slot) const;
  const ParamStoreOptions& options() const { return options_; }
  int64_t gpu_blocks() const;

  /// Note [Parameter groups]: each parameter's group, `group_of(param)` (-1: none, the engine's
  /// hyper-parameters and no weight decay on 1-D parameters); a parameter in a group is decayed by
  /// its group's weight decay whatever its rank, as torch's AdamW does.
  void assign_groups(const std::function<int(const torch::Tensor&)>& group_of);
  /// The groups' hyper-parameters from the next update on (between steps); an update in flight
  /// keeps the table it started with.
  void set_group_hypers(std::vector<GroupHyper> groups);
  /// The current table (shared with the updates that use it); null when no group was set.
  std::shared_ptr<const std::vector<GroupHyper>> group_hypers() const;
  /// One parameter's fp32 master and AdamW moments in its shape (an unsharded store), where they
  /// live (the host, or the GPU for a GPU-updated Block): views of the store where they are fp32,
  /// as torch's optimizers hand out their live state, else decoded copies; UserError when the store
  /// does not hold it.
  std::vector<torch::Tensor> param_state(const torch::Tensor& param);
  /// Sets one parameter's master and moments (any float dtype, cast to the store's) and its
  /// working copy from the new master (an unsharded store, between steps).
  void load_param_state(const torch::Tensor& param, const torch::Tensor& master, const torch::Tensor& m,
                        const torch::Tensor& v);

  /// Moves Block i's master and states to the other side: bit for bit with an fp32 master and
  /// states; bf16 or 8-bit host states, and a bf16 master, widen (decode) exactly on the way to the
  /// GPU and round (encode) on the way back.
  void move_block(size_t i, UpdateSide side);
  /// Sets the first `gpu_blocks` Blocks GPU-updated (in forward order, skipping those kept on the
  /// CPU by keep_cpu_updated) and the rest CPU-updated, moving what changes.
  void set_gpu_blocks(int64_t gpu_blocks);
  /// Blocks that stay CPU-updated whatever the split (those that may run on the CPU, Note [Block
  /// placement]); moves any of them now GPU-updated back to the CPU.
  void keep_cpu_updated(const std::vector<bool>& keep);
  /// Binds Block i's parameters to its host copies (staging, landing) or back to the device's
  /// (working, grad) (Note [Block placement]). The Block must be CPU-updated with its own landing
  /// and staging buffers in the compute dtype (no ring, unsharded, fp32 or bf16).
  void bind_block(size_t i, bool host);

  /// Rebinds each parameter's .grad to its view of the flat gradient where a training loop dropped
  /// or replaced it (zero_grad(set_to_none=True)); the engine reads gradients from the flat buffers.
  void restore_grad_views();

  /// working = master (cast to the compute dtype), for every Block, and the CPU-updated Blocks'
  /// staging too (the host copy a host-run Block computes with); synchronous.
  void sync_working_from_master();
  bool sharded() const { return options_.shard_count > 1; }
  /// Sharded stores: all-gathers Block i's working weights from every rank's slice, on the current
  /// stream, over the device group of `lane` (Note [Process groups]).
  void gather_working(size_t i, int lane);
  /// Sharded stores: this rank's slices under "<block>.master", "<block>.exp_avg", "<block>.exp_avg_sq"
  /// (views; fp32 copies of 8-bit states and of bf16 masters), for checkpoints (Note [Sharded checkpoints]).
  std::vector<NamedTensor> shard_state();
  /// Sharded stores: fills this rank's slices from `read(name, kind, offset, n, out)`, which copies
  /// elements [offset, offset + n) of Block `name`'s whole range of master, "exp_avg" or
  /// "exp_avg_sq" into `out` (fp32); the padding stays zero. Then refreshes the working weights.
  void load_shard_state(
      const std::function<void(const std::string&, const std::string&, int64_t, int64_t, torch::Tensor)>& read);

  /// Runs `fn` with the module's parameters bound to the masters on the host (CPU-updated: fp32, or
  /// a bf16 master as it is, its compensation in state()) or the device (GPU-updated, fp32), so
  /// checkpoint code reads and writes the weights the optimizer keeps; then binds them back to the
  /// working copies and refreshes those from the masters.
  void with_masters_bound(const std::function<void()>& fn);

  /// The NVMe tier's Blocks' states (Note [NVMe tier]); null without it.
  DiskStates* disk() { return disk_.get(); }

  /// Wall seconds the constructor spent allocating and pinning the host masters and states (Note
  /// [Pinned host buffers]).
  double pin_seconds() const { return pin_seconds_; }

  /// Optimizer state under FusedAdamW's names ("<param>.exp_avg", "<param>.exp_avg_sq",
  /// "<param>.step"): views of m and v (fp32 copies decoded from 8-bit states), and `step` for
  /// every parameter; a Kahan-compensated bf16 master's compensation as "<param>.master_comp".
  std::vector<NamedTensor> state(const torch::Tensor& step);
  /// Sets m and v of every parameter from `lookup` (the names of state(), any float dtype: fp32,
  /// bf16 and 8-bit states resume from each other), a master's compensation where the store keeps
  /// one (zero where the checkpoint has none), and `step` from the first parameter's.
  void load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                  const std::string& source, torch::Tensor& step);

 private:
  void bind_working();
  void allocate_host_side(BlockStore& b);  // landing, staging and undo of a CPU-updated Block
  torch::Tensor host_buffer(int64_t n, torch::ScalarType t) const;
  /// Block `bi`'s parameters, offsets and this rank's slice; no buffers yet.
  BlockStore describe_block(BlockSequence& model, size_t bi, int64_t base, UpdateSide side) const;
  /// master, m and v on the Block's update side, the master filled from the parameters.
  void allocate_masters(BlockStore& b);
  /// working and grad on the device, filled from the master, and the parameters rebound to them.
  void bind_to_working(BlockStore& b);
  torch::ScalarType landing_dtype() const;
  /// The Block holding `param` and its FlatParam there; UserError when none does.
  std::pair<BlockStore*, const FlatParam*> find(const torch::Tensor& param);
  ParamStoreOptions options_;
  std::vector<BlockStore> blocks_;
  std::vector<RingSlot> ring_;
  std::vector<bool> keep_cpu_;  // per Block: stays CPU-updated (keep_cpu_updated)
  double pin_seconds_ = 0.0;
  std::shared_ptr<const std::vector<GroupHyper>> groups_;  // Note [Parameter groups]
  std::unique_ptr<DiskStates> disk_;                       // Note [NVMe tier]
};

}  // namespace tandem
