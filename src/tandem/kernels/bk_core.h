#pragma once
// BK-core: the diagonal of the resolvent G = (H - zI)^-1 of a batch of tridiagonal matrices H
// (ResNet-BK). H has main diagonal a (B, N), upper diagonal b (B, N-1) and lower diagonal c
// (B, N-1), all real; z is a complex shift, one per batch row or one for all.
//
// Note [BK-core ratio form]
// The textbook recursions theta_i = (a_i - z) theta_{i-1} - b_{i-1} c_{i-1} theta_{i-2} (forward)
// and phi_i = (a_i - z) phi_{i+1} - b_i c_i phi_{i+2} (backward), with G_ii = theta_{i-1} phi_{i+1}
// / theta_N, overflow within a few hundred elements. tandem runs their ratios instead, which stay
// of the order of the entries:
//   r_0 = d_0,      r_i = d_i - p_{i-1} / r_{i-1}      (r_i = theta_i / theta_{i-1})
//   s_{N-1} = d_{N-1}, s_i = d_i - p_i / s_{i+1}        (s_i = phi_i / phi_{i+1})
//   G_ii = 1 / (r_i + s_i - d_i)
// with d_i = a_i - z and p_i = b_i c_i. Both are O(N) sweeps with one complex division per element;
// the backward pass is the exact reverse-mode derivative of these sweeps (two more O(N) sweeps),
// so no N x N quantity is ever formed and N = 10^6 costs what N = 10^3 costs per element.

#include <torch/torch.h>

#include <tuple>

namespace tandem {

/// Arithmetic of the sweeps.
enum class BkCoreMode {
  kNative,  ///< complex128 for double inputs, complex64 for float inputs
  kMixed,   ///< float inputs: complex64 sweeps, the final r + s - d and its reciprocal in complex128
};

/// Which diagonal: of G itself, or the causal one, where entry i is the last diagonal entry of the
/// resolvent of H's leading (i+1) x (i+1) block, 1 / r_i, so it depends on positions <= i only
/// (what a decoder may use).
enum class BkCoreDiagonal { kFull, kCausal };

/// diag(G) as complex (B, N): complex128 for double inputs, complex64 for float inputs, computed
/// by the batch-parallel CPU kernel or, for CUDA tensors, the CUDA kernels. z: a complex 0-d
/// tensor or (B). Differentiable in a, b, c and z (torch::autograd::Function).
torch::Tensor bk_core(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& z,
                      BkCoreMode mode = BkCoreMode::kNative, BkCoreDiagonal diagonal = BkCoreDiagonal::kFull);

namespace detail {

/// Checks shapes, dtypes, devices and the mode; UserError naming the mismatch.
void bk_core_validate(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& z,
                      BkCoreMode mode = BkCoreMode::kNative);

/// The complex dtype of the sweeps for real inputs of dtype `real` (complex128 for double).
torch::ScalarType bk_core_complex_type(torch::ScalarType real);

/// Forward on the CPU: G (B, N) and the ratios r, s (B, N) the backward pass reuses.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> bk_core_forward_cpu(
    const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& z,
    BkCoreMode mode = BkCoreMode::kNative, bool causal = false);
/// Backward on the CPU from grad_G (B, N complex): grads of a, b, c (real, their shapes) and z
/// (complex, (B)).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> bk_core_backward_cpu(
    const torch::Tensor& grad_g, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& g,
    const torch::Tensor& r, const torch::Tensor& s, bool causal = false);

/// The CUDA implementation, registered by the CUDA build (kernels/bk_core_cuda.cpp); null without it.
/// Its forward returns r and s only with `keep_ratios` (undefined tensors otherwise: no autograd).
struct BkCoreCudaOps {
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> (*forward)(const torch::Tensor& a, const torch::Tensor& b,
                                                                     const torch::Tensor& c, const torch::Tensor& z,
                                                                     BkCoreMode mode, bool causal, bool keep_ratios);
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> (*backward)(
      const torch::Tensor& grad_g, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& g,
      const torch::Tensor& r, const torch::Tensor& s, bool causal);
};
const BkCoreCudaOps*& bk_core_cuda_ops();

/// The same sweeps written with LibTorch tensor ops, one op per position over the (B) batch column:
/// differentiable by autograd, device-agnostic, and slow (O(N) kernel launches). The fallback and
/// benchmark baseline, and an independent check of the analytic backward.
torch::Tensor bk_core_ops(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                          const torch::Tensor& z, bool causal = false);

/// The reference: the same recursion in long double (64-bit mantissa), one row at a time, no
/// threads; the oracle the fast paths are measured against. Returns complex128 (B, N).
torch::Tensor bk_core_reference(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                                const torch::Tensor& z);

}  // namespace detail
}  // namespace tandem
