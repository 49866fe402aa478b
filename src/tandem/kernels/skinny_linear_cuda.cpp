// The skinny linear for CUDA tensors: the output in LibTorch, the kernel in skinny_linear.cu on the
// current stream (Note [Skinny linear]). Registered at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/core/error.h"
#include "tandem/kernels/element_type_of.h"
#include "tandem/kernels/skinny_linear.h"
#include "tandem/kernels/skinny_linear_launch.h"

namespace tandem::detail {
namespace {

torch::Tensor skinny_linear_cuda_impl(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias_in) {
  const c10::cuda::CUDAGuard guard(x.device());
  const ElementType elem = checked_element_type(x.scalar_type(), "the skinny linear");
  torch::Tensor bias;
  if (bias_in.defined()) {
    bias = bias_in.to(x.scalar_type()).contiguous();
    TANDEM_ASSERT(bias.numel() == w.size(0), "a bias of ", bias.numel(), " for ", w.size(0), " outputs");
  }
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
  launch_skinny_linear(x.data_ptr(), w.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr, y.data_ptr(), x.size(0),
                       x.size(1), w.size(0), elem, c10::cuda::getCurrentCUDAStream());
  return y;
}

struct Register {
  Register() { skinny_linear_cuda() = &skinny_linear_cuda_impl; }
} register_skinny_linear_cuda;

}  // namespace
}  // namespace tandem::detail
