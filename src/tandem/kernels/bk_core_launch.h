#pragma once
// Launchers of the BK-core CUDA kernels (kernels/bk_core.cu): raw device pointers and an explicit
// stream, no LibTorch. Complex values are (re, im) pairs of T. See Note [BK-core ratio form].

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::detail {

/// Forward sweeps, one batch row per thread: g, r, s (B, N) complex; z (B) complex. With
/// `mixed` (float only) the final r + s - d and its reciprocal are computed in double. With
/// `causal`, s_i = d_i (the diagonal of the leading blocks' resolvents, 1 / r_i).
template <class T>
void launch_bk_core_forward(const T* a, const T* b, const T* c, const T* z, T* g, T* r, T* s, int64_t B, int64_t N,
                            bool mixed, bool causal, cudaStream_t stream);

/// Backward sweeps: from grad_g (B, N) complex to ga (B, N), gb, gc (B, N-1) real and gz (B)
/// complex; work (B, 3N) complex scratch.
template <class T>
void launch_bk_core_backward(const T* grad_g, const T* b, const T* c, const T* g, const T* r, const T* s, T* ga, T* gb,
                             T* gc, T* gz, T* work, int64_t B, int64_t N, bool causal, cudaStream_t stream);

}  // namespace tandem::detail
