// The device-side Adam's dispatch (Note [Device Adam]).

#include "tandem/kernels/device_adam.h"

#include "tandem/core/error.h"

namespace tandem {
namespace detail {

DeviceAdamFn& device_adam_cuda() {
  static DeviceAdamFn fn = nullptr;
  return fn;
}

}  // namespace detail

namespace {

bool float_type(const torch::Tensor& t) {
  const auto s = t.scalar_type();
  return s == torch::kFloat32 || s == torch::kFloat16 || s == torch::kBFloat16;
}

}  // namespace

bool device_adam_takes(const torch::Tensor& master, const torch::Tensor& grad, const torch::Tensor& m,
                       const torch::Tensor& v, const torch::Tensor& out) {
  if (detail::device_adam_cuda() == nullptr || !master.defined() || !master.is_cuda()) return false;
  const auto n = master.numel();
  const auto same = [&](const torch::Tensor& t) {
    return t.defined() && t.device() == master.device() && t.numel() == n && t.is_contiguous();
  };
  const auto st = m.defined() ? m.scalar_type() : torch::kFloat32;
  return master.scalar_type() == torch::kFloat32 && master.is_contiguous() && same(grad) && float_type(grad) &&
         same(m) && same(v) && v.scalar_type() == st && (st == torch::kFloat32 || st == torch::kBFloat16) &&
         (!out.defined() || (same(out) && float_type(out)));
}

void device_adam(const torch::Tensor& master, const torch::Tensor& grad, const torch::Tensor& m,
                 const torch::Tensor& v, const torch::Tensor& out, const DeviceAdamCoeffs& c, uint64_t index_base) {
  TANDEM_CHECK(device_adam_takes(master, grad, m, v, out),
               "the device Adam takes contiguous CUDA tensors of one length: an fp32 master, fp32 or bf16 states, "
               "float gradients and output; got master ",
               master.scalar_type(), " on ", master.device(), ", grad ", grad.scalar_type(), ", m ", m.scalar_type(),
               ", v ", v.scalar_type());
  detail::device_adam_cuda()(master, grad, m, v, out, c, index_base);
}

}  // namespace tandem
