// The device Adam for CUDA tensors: the kernel in device_adam.cu on the current stream (Note
// [Device Adam]). Registered at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/core/error.h"
#include "tandem/kernels/device_adam.h"
#include "tandem/kernels/device_adam_launch.h"
#include "tandem/kernels/element_type_of.h"

namespace tandem::detail {
namespace {

ElementType type_of(const torch::Tensor& t) { return checked_element_type(t.scalar_type(), "the device Adam"); }

void device_adam_cuda_impl(const torch::Tensor& master, const torch::Tensor& grad, const torch::Tensor& m,
                           const torch::Tensor& v, const torch::Tensor& out, const DeviceAdamCoeffs& c,
                           uint64_t index_base) {
  const c10::cuda::CUDAGuard guard(master.device());
  DeviceAdamSpan s;
  s.master = master.data_ptr<float>();
  s.grad = grad.data_ptr();
  s.m = m.data_ptr();
  s.v = v.data_ptr();
  s.out = out.defined() ? out.data_ptr() : nullptr;
  s.n = master.numel();
  s.index_base = index_base;
  launch_device_adam(s, c, type_of(grad), type_of(m), out.defined() ? type_of(out) : ElementType::kF32,
                     c10::cuda::getCurrentCUDAStream());
}

struct Register {
  Register() { device_adam_cuda() = &device_adam_cuda_impl; }
} register_device_adam_cuda;

}  // namespace
}  // namespace tandem::detail
