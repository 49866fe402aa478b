#pragma once
// The arguments of RoPE with the key/value cache writes, shared by the kernel that does only that
// (decode_fusions_cuda.cpp, Note [Decode fusions]) and the q/k/v product that does it as its
// epilogue (skinny_epilogues_cuda.cpp, Note [Skinny epilogues]). CUDA builds only.

#include <torch/torch.h>

#include "tandem/kernels/decode_fusions_launch.h"

namespace tandem::detail {

/// The launch arguments and the tensors they point into (kept alive until the launch).
struct RopeKvLaunch {
  RopeKvArgs args;
  torch::Tensor cos, sin, page, slot, q, k;
};

/// The arguments for `rows` rows of a projection of `width` features in `like`'s dtype and device,
/// q (rows, heads, hd) and k (rows, kv_heads, hd) allocated, the shapes and dtypes checked (`what`
/// names the caller). args.qkv is left null for the caller.
RopeKvLaunch rope_kv_launch(const char* what, const torch::Tensor& like, int64_t rows, int64_t width, int64_t heads,
                            int64_t kv_heads, const torch::Tensor& cos, const torch::Tensor& sin,
                            torch::Tensor& k_cache, torch::Tensor& v_cache, const torch::Tensor& page,
                            const torch::Tensor& slot);

}  // namespace tandem::detail
