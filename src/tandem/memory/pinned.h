#pragma once
// Host buffers for the offload engine's host tier: zero-filled, backed by huge pages where the
// kernel allows, and page-locked for asynchronous copies when asked.
//
// Note [Pinned host buffers]
// Two facts shape these buffers.
// 1. Size: LibTorch's pinned allocator (the caching host allocator behind pinned_memory(true))
//    rounds every request up to the next power of two so that freed blocks can be reused. For the
//    engine's buffers, which live for the whole run, that is pure loss: a 13B layer's fp32 master
//    (1.27 GB) would take 2 GiB. These buffers are mapped at their size (rounded to a page).
// 2. Speed: cudaHostAlloc locks 4 KiB pages one by one, about 1.1 GB/s on one thread and 2 GB/s on
//    three (bench/pin_bench.cpp on an H100 host, docs/benchmarks.md), which made pinning a 13B host
//    tier take most of a minute. Here a buffer is an anonymous mapping aligned to 2 MiB and advised
//    to use transparent huge pages, its pages are faulted in on every core of tandem's pool, and the
//    driver then registers the mapping (cudaHostRegister): 512 times fewer pages to lock, about
//    20 GB/s. Without transparent huge pages it still registers at about 9 GB/s.
// Fresh anonymous pages are zero, so every buffer starts zero-filled and callers do not clear them
// again (the optimizer states, the masters' padding).

#include <torch/torch.h>

#include <functional>

namespace tandem {

/// Whether a host buffer is page-locked for asynchronous copies.
enum class HostMemory { kPageable, kPinned };

/// A zero-filled 1-D tensor of `n` elements of `dtype` in host memory of that size (Note [Pinned
/// host buffers]); page-locked when `memory` is kPinned and an accelerator is present. A refused
/// pin is a UserError naming the size and the way out (offload.pin_memory=false, or a smaller host
/// tier per the plan).
torch::Tensor host_tensor(int64_t n, torch::ScalarType dtype, HostMemory memory);

/// Pinned byte slabs of host_tensor for activation offload's arena (Note [Activation host arena]).
std::function<torch::Tensor(int64_t bytes)> pinned_slabs();

}  // namespace tandem
