#pragma once
// Activation checkpointing for one Block: forward without saving activations, recompute in backward.

#include <torch/torch.h>

#include "tandem/models/block.h"

namespace tandem {

/// Runs block(x) so that only x is kept for backward; the block's activations are rebuilt in
/// backward under the autocast state of the original forward. Gradients of the block's
/// parameters accumulate into their .grad as usual.
torch::Tensor checkpointed_forward(Block& block, const torch::Tensor& x);

}  // namespace tandem
