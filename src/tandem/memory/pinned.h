#pragma once
// Page-locked host buffers of exactly the requested size, for the offload engine's host tier.
//
// Note [Exact pinned buffers]
// LibTorch's pinned allocator (the caching host allocator behind pinned_memory(true)) rounds
// every request up to the next power of two so that freed blocks can be reused. For the engine's
// buffers, which live for the whole run, that is pure loss: a 13B layer's fp32 master (1.27 GB)
// takes 2 GiB, and the host tier of a 13B model grows by half. These buffers come straight from
// the driver (cudaHostAlloc) at their exact size and go back when the last tensor viewing them is
// freed. Copies to and from them are asynchronous like those from LibTorch's pinned blocks.

#include <torch/torch.h>

namespace tandem {

/// A 1-D tensor of `n` elements of `dtype` in page-locked host memory of exactly that size when
/// `pin` and an accelerator is present, else in plain host memory. A refused pin is a UserError
/// naming the size and the way out (offload.pin_memory=false, or less host memory per the plan).
torch::Tensor host_tensor(int64_t n, torch::ScalarType dtype, bool pin);

}  // namespace tandem
