#pragma once
// Launcher of the skinny linear's CUDA kernel (kernels/skinny_linear.cu): raw device pointers and
// an explicit stream, no LibTorch. See Note [Skinny linear].

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tandem/kernels/element_type.h"

namespace tandem::detail {

/// y (rows, O) = x (rows, K) w (O, K)^T + bias (O, or null); every pointer contiguous and 16-byte
/// aligned, K a multiple of 8, rows at most 4.
void launch_skinny_linear(const void* x, const void* w, const void* bias, void* y, int64_t rows, int64_t K, int64_t O,
                          ElementType elem, cudaStream_t stream);

}  // namespace tandem::detail
