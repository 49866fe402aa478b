// BK-core for CUDA tensors: shapes, dtypes and scratch in LibTorch, the sweeps in bk_core.cu on
// the current stream. Registered into bk_core() at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/core/error.h"
#include "tandem/kernels/bk_core.h"
#include "tandem/kernels/bk_core_launch.h"

namespace tandem::detail {
namespace {

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward_cuda(const torch::Tensor& a_in,
                                                                     const torch::Tensor& b_in,
                                                                     const torch::Tensor& c_in,
                                                                     const torch::Tensor& z_in, BkCoreMode mode,
                                                                     bool causal) {
  bk_core_validate(a_in, b_in, c_in, z_in, mode);
  torch::NoGradGuard no_grad;
  const c10::cuda::CUDAGuard guard(a_in.device());
  const auto a = a_in.contiguous(), b = b_in.contiguous(), c = c_in.contiguous();
  const int64_t B = a.size(0), N = a.size(1);
  const auto ct = bk_core_complex_type(a.scalar_type());
  const auto opts = a.options().dtype(ct);
  const auto zb = z_in.detach().to(a.device(), ct).expand({B}).contiguous();
  auto g = torch::empty({B, N}, opts), r = torch::empty({B, N}, opts), s = torch::empty({B, N}, opts);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (a.scalar_type() == torch::kFloat64)
    launch_bk_core_forward<double>(a.data_ptr<double>(), b.data_ptr<double>(), c.data_ptr<double>(),
                                   reinterpret_cast<const double*>(zb.data_ptr()),
                                   reinterpret_cast<double*>(g.data_ptr()), reinterpret_cast<double*>(r.data_ptr()),
                                   reinterpret_cast<double*>(s.data_ptr()), B, N, false, causal, stream);
  else
    launch_bk_core_forward<float>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                                  reinterpret_cast<const float*>(zb.data_ptr()), reinterpret_cast<float*>(g.data_ptr()),
                                  reinterpret_cast<float*>(r.data_ptr()), reinterpret_cast<float*>(s.data_ptr()), B, N,
                                  mode == BkCoreMode::kMixed, causal, stream);
  return {g, r, s};
}

template <class T>
void backward_typed(const torch::Tensor& gg, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& g,
                    const torch::Tensor& r, const torch::Tensor& s, torch::Tensor& ga, torch::Tensor& gb,
                    torch::Tensor& gc, torch::Tensor& gz, torch::Tensor& work, bool causal) {
  auto cp = [](const torch::Tensor& t) { return reinterpret_cast<const T*>(t.data_ptr()); };
  auto mp = [](torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); };
  launch_bk_core_backward<T>(cp(gg), cp(b), cp(c), cp(g), cp(r), cp(s), mp(ga), mp(gb), mp(gc), mp(gz), mp(work),
                             g.size(0), g.size(1), causal, c10::cuda::getCurrentCUDAStream());
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> backward_cuda(
    const torch::Tensor& grad_g, const torch::Tensor& b_in, const torch::Tensor& c_in, const torch::Tensor& g,
    const torch::Tensor& r, const torch::Tensor& s, bool causal) {
  torch::NoGradGuard no_grad;
  const c10::cuda::CUDAGuard guard(g.device());
  const auto b = b_in.contiguous(), c = c_in.contiguous();
  const auto gg = grad_g.to(g.scalar_type()).contiguous();
  const int64_t B = g.size(0), N = g.size(1);
  const auto ro = b.options();
  auto ga = torch::empty({B, N}, ro), gb = torch::empty({B, N - 1}, ro), gc = torch::empty({B, N - 1}, ro);
  auto gz = torch::empty({B}, g.options());
  auto work = torch::empty({B, 3 * N}, g.options());
  if (b.scalar_type() == torch::kFloat64)
    backward_typed<double>(gg, b, c, g, r, s, ga, gb, gc, gz, work, causal);
  else
    backward_typed<float>(gg, b, c, g, r, s, ga, gb, gc, gz, work, causal);
  return {ga, gb, gc, gz};
}

const BkCoreCudaOps kOps{&forward_cuda, &backward_cuda};

struct Register {
  Register() { bk_core_cuda_ops() = &kOps; }
} register_bk_core_cuda;

}  // namespace
}  // namespace tandem::detail
