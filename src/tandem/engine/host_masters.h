#pragma once
// A Block's master weights as the store keeps them: fp32 on the device (GPU-updated Blocks), and on
// the host in fp32, or in bf16 rounded stochastically, or in bf16 with a bf16 Kahan compensation
// (Note [bf16 master]). Everything outside the CPU kernels reads and writes them here, in fp32.

#include <torch/torch.h>

#include <functional>

#include "tandem/optim/cpu_update.h"

namespace tandem {

struct BlockStore;

// The host master of CPU-updated Blocks (optim.master_dtype, optim.master_rounding) is a MasterKind
// (optim/cpu_update.h).

/// Whether the Block's master is bf16 (CPU-updated, optim.master_dtype=bf16).
bool bf16_master(const BlockStore& b);

/// Allocates the Block's host master (and its compensation) in `kind`, zero, through
/// `alloc(n, dtype)` (pinned or not).
void allocate_host_master(BlockStore& b, MasterKind kind,
                          const std::function<torch::Tensor(int64_t, torch::ScalarType)>& alloc);

/// Elements [offset, offset + n) of the Block's master slice in fp32, on the master's device: a
/// view where the master is fp32, else a decoded copy (the bf16 master plus its compensation).
torch::Tensor master_f32(const BlockStore& b, int64_t offset, int64_t n);
/// The whole slice (shard_numel).
torch::Tensor master_f32(const BlockStore& b);

/// Sets elements [offset, offset + x.numel()) of the master from values of any float dtype and
/// device: copied into an fp32 master; into a bf16 one rounded to nearest, with what the rounding
/// lost (rounded to nearest) in the compensation where there is one, as an update stores the pair:
/// master_f32 gives x back to about 16 bits, and a pair read out and set again is the same pair.
void set_master(BlockStore& b, int64_t offset, const torch::Tensor& x);

}  // namespace tandem
