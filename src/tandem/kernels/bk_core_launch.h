#pragma once
// Launchers of the BK-core CUDA kernels (kernels/bk_core.cu): raw device pointers and an explicit
// stream, no LibTorch. Complex values are (re, im) pairs of T. See Note [BK-core ratio form] and
// Note [BK-core scan kernels].

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tandem::detail {

/// Tiles per row (one warp each): the length of the gz partials of the backward pass.
int64_t bk_core_tiles(int64_t N);

/// Bytes of device scratch the forward (or backward) launcher needs for reals of `real_size`.
int64_t bk_core_scratch_bytes(int64_t B, int64_t N, size_t real_size, bool backward);

/// Forward: g, r, s (B, N) complex, each optional (null: not written); z (B) complex. With
/// `mixed` (float only) the final r + s - d and its reciprocal are computed in double. With
/// `causal`, s_i = d_i (the diagonal of the leading blocks' resolvents, 1 / r_i).
template <class T>
void launch_bk_core_forward(const T* a, const T* b, const T* c, const T* z, T* g, T* r, T* s, int64_t B, int64_t N,
                            bool mixed, bool causal, void* scratch, cudaStream_t stream);

/// Backward: from grad_g (B, N) complex to ga (B, N), gb, gc (B, N-1) real and gz_part
/// (B, bk_core_tiles(N)) complex, whose row sums are the gradient of z.
template <class T>
void launch_bk_core_backward(const T* grad_g, const T* b, const T* c, const T* g, const T* r, const T* s, T* ga, T* gb,
                             T* gc, T* gz_part, int64_t B, int64_t N, bool causal, void* scratch, cudaStream_t stream);

}  // namespace tandem::detail
