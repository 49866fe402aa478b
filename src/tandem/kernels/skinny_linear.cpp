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

bool skinny_linear_takes(const torch::Tensor& x, const torch::Tensor& w) {
  const auto t = x.scalar_type();
  return detail::skinny_linear_cuda() != nullptr && x.is_cuda() && w.device() == x.device() && x.dim() == 2 &&
         w.dim() == 2 && w.scalar_type() == t &&
         (t == torch::kFloat32 || t == torch::kFloat16 || t == torch::kBFloat16) && x.size(0) <= kSkinnyRows &&
         x.size(1) == w.size(1) && x.size(1) % 8 == 0 && x.is_contiguous() && w.is_contiguous() &&
         reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0;
}

void require_skinny_linear_takes(const torch::Tensor& x, const torch::Tensor& w, const char* what) {
  TANDEM_CHECK(skinny_linear_takes(x, w), what, " takes contiguous CUDA x (N <= ", kSkinnyRows,
               ", K) and w (O, K) of one float dtype, K a multiple of 8; got x ", x.sizes(), " ", x.scalar_type(),
               " on ", x.device(), ", w ", w.sizes(), " ", w.scalar_type());
}

torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
  require_skinny_linear_takes(x, w, "the skinny linear");
  return detail::skinny_linear_cuda()(x, w, bias);
}

}  // namespace tandem
