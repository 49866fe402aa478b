#pragma once
// x W^T (+ b) for the few rows of a decode step: a CUDA kernel that streams the weight matrix once,
// launched as a dependent of the kernel before it (Note [Dependent launch]).
//
// Note [Skinny linear]
// A batch-1 decode step is a chain of matrix-vector products: each reads its weight matrix once and
// does two flops a byte read, so it is bound by memory bandwidth alone. Measured with Nsight Compute on
// an H100 (docs/benchmarks.md), the products cuBLAS chose for one row ran at about 54 % of the
// bandwidth. From a CUDA graph with the weights spilling L2 (`tandem bench skinny_linear`), this
// kernel read 1.8-2.8 TB/s on a 1B and a 7B layer's products, cuBLAS 1.3-2.7: 0.69-1.04x its time,
// ahead most on the small products, whose time is mostly the launch and the first loads. Here one
// warp computes one output feature for every row: its lanes read the weight row
// in 16-byte pieces, several in flight, multiply them with the rows of x (a few kilobytes, served
// from L1), sum in fp32 and reduce across the warp; the bias is added in fp32 before the one
// rounding to the output dtype, as cuBLAS's epilogue does. Up to kSkinnyRows rows; beyond that the
// same weights serve each extra row from L1 only if they fit, so cuBLAS takes over.

#include <torch/torch.h>

namespace tandem {

/// The most rows of x the kernel takes.
constexpr int64_t kSkinnyRows = 4;

/// Whether skinny_linear() takes x (N, K) and w (O, K): CUDA tensors of one dtype among fp32, fp16
/// and bf16, contiguous and 16-byte aligned, N <= kSkinnyRows, K a multiple of 8, in a build with the
/// CUDA kernels.
bool skinny_linear_takes(const torch::Tensor& x, const torch::Tensor& w);

/// Refuses, naming `what` and what it takes, the x and w that skinny_linear_takes does not take:
/// the check of the skinny linear and of the products built on it (Note [Skinny epilogues]).
void require_skinny_linear_takes(const torch::Tensor& x, const torch::Tensor& w, const char* what);

/// y (N, O) = x w^T + bias (bias (O) or undefined), in x's dtype, accumulated in fp32.
torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias);

namespace detail {

/// The CUDA implementation, registered by the CUDA build (kernels/skinny_linear_cuda.cpp).
using SkinnyLinearFn = torch::Tensor (*)(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias);
SkinnyLinearFn& skinny_linear_cuda();

}  // namespace detail
}  // namespace tandem
