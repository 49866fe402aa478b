// The skinny linear's dispatch (Note [Skinny linear]).

#include "tandem/kernels/skinny_linear.h"

#include <cstdint>

#include "tandem/core/error.h"

namespace tandem {
namespace detail {

SkinnyLinearFn& skinny_linear_cuda() {
  static SkinnyLinearFn fn = nullptr;
  return fn;
}

}  // namespace detail

namespace {

// x (N, K) and w (O, cols) as the kernel takes them.
bool operands_taken(const torch::Tensor& x, const torch::Tensor& w, int64_t cols) {
  const auto t = x.scalar_type();
  return detail::skinny_linear_cuda() != nullptr && x.is_cuda() && w.device() == x.device() && x.dim() == 2 &&
         w.dim() == 2 && w.scalar_type() == t &&
         (t == torch::kFloat32 || t == torch::kFloat16 || t == torch::kBFloat16) && x.size(0) <= kSkinnyRows &&
         w.size(1) == cols && cols % 8 == 0 && x.is_contiguous() && w.is_contiguous() &&
         reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0;
}

}  // namespace

bool skinny_linear_takes(const torch::Tensor& x, const torch::Tensor& w) {
  return x.dim() == 2 && operands_taken(x, w, x.size(1));
}

torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
  TANDEM_CHECK(skinny_linear_takes(x, w), "the skinny linear takes contiguous CUDA x (N <= ", kSkinnyRows,
               ", K) and w (O, K) of one float dtype, K a multiple of 8; got x ", x.sizes(), " ", x.scalar_type(),
               " on ", x.device(), ", w ", w.sizes(), " ", w.scalar_type());
  return detail::skinny_linear_cuda()(x, w, bias, false);
}

bool skinny_linear_silu_takes(const torch::Tensor& gu, const torch::Tensor& w) {
  return gu.dim() == 2 && gu.size(1) % 2 == 0 && gu.scalar_type() != torch::kFloat32 &&
         operands_taken(gu, w, gu.size(1) / 2);
}

torch::Tensor skinny_linear_silu(const torch::Tensor& gu, const torch::Tensor& w, const torch::Tensor& bias) {
  TANDEM_CHECK(skinny_linear_silu_takes(gu, w),
               "the skinny linear of silu(gate) * up takes contiguous CUDA gu (N <= ", kSkinnyRows,
               ", 2F) and w (O, F) of one dtype, fp16 or bf16, F a multiple of 8; got gu ", gu.sizes(), " ",
               gu.scalar_type(), " on ", gu.device(), ", w ", w.sizes(), " ", w.scalar_type());
  return detail::skinny_linear_cuda()(gu, w, bias, true);
}

}  // namespace tandem
