#pragma once
// A Block's Adam moments as the store keeps them: fp32 on the device (GPU-updated Blocks), and on
// the host in fp32, bf16, or 8-bit codes with a scale per 2048 elements of each parameter's slice
// (Note [8-bit states]). Everything outside the CPU kernels reads and writes them here, in fp32.

#include <torch/torch.h>

#include <functional>
#include <utility>

namespace tandem {

struct BlockStore;

/// Whether the Block's states are 8-bit codes (CPU-updated, optim.state_dtype=int8).
bool q8_states(const BlockStore& b);

/// Allocates the Block's host states in `dtype` (kInt8: m as int8 and v as uint8 codes, with their
/// scales laid out per parameter slice), zero, through `alloc(n, dtype)` (pinned or not).
void allocate_host_states(BlockStore& b, torch::ScalarType dtype,
                          const std::function<torch::Tensor(int64_t, torch::ScalarType)>& alloc);
/// Allocates the undo copies of the Block's host states (and their scales).
void allocate_undo_states(BlockStore& b);

/// fp32 copies of m and v (shard_numel each, on the states' device; the padding zero), decoded
/// from codes where they are 8-bit. fp32 states are returned as they are (not copied).
std::pair<torch::Tensor, torch::Tensor> states_f32(const BlockStore& b);
/// Sets m and v from fp32 values (shard_numel each, any device): copied (rounded to bf16 where the
/// states are bf16), or encoded where they are 8-bit.
void set_states(BlockStore& b, const torch::Tensor& m, const torch::Tensor& v);

/// The same for parameter k of the Block's slice (b.shard_params[k]; its own scales, so nothing
/// else of the Block is read or written): its m and v in fp32, flat, on the states' device: views of
/// the store where the states are fp32, else decoded copies.
std::pair<torch::Tensor, torch::Tensor> param_states_f32(const BlockStore& b, size_t k);
/// Sets parameter k's m and v from values of any float dtype and device (its numel each).
void set_param_states(BlockStore& b, size_t k, const torch::Tensor& m, const torch::Tensor& v);

}  // namespace tandem
