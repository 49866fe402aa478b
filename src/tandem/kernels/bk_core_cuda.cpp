// BK-core for CUDA tensors: shapes, dtypes and scratch in LibTorch, the sweeps in bk_core.cu on
// the current stream. Registered into bk_core() at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/core/error.h"
#include "tandem/kernels/bk_core.h"
#include "tandem/kernels/bk_core_launch.h"

namespace tandem::detail {
namespace {

torch::Tensor scratch(const torch::Tensor& like, int64_t B, int64_t N, bool backward) {
  return torch::empty({bk_core_scratch_bytes(B, N, like.element_size(), backward)},
                      like.options().dtype(torch::kUInt8));
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward_cuda(const torch::Tensor& a_in,
                                                                     const torch::Tensor& b_in,
                                                                     const torch::Tensor& c_in,
                                                                     const torch::Tensor& z_in, BkCoreMode mode,
                                                                     bool causal, bool keep_ratios) {
  bk_core_validate(a_in, b_in, c_in, z_in, mode);
  torch::NoGradGuard no_grad;
  const c10::cuda::CUDAGuard guard(a_in.device());
  const auto a = a_in.contiguous(), b = b_in.contiguous(), c = c_in.contiguous();
  const int64_t B = a.size(0), N = a.size(1);
  const auto ct = bk_core_complex_type(a.scalar_type());
  const auto opts = a.options().dtype(ct);
  const auto zb = z_in.detach().resolve_conj().resolve_neg().to(a.device(), ct).expand({B}).contiguous();
  auto g = torch::empty({B, N}, opts);
  torch::Tensor r, s;
  if (keep_ratios) r = torch::empty({B, N}, opts), s = torch::empty({B, N}, opts);
  auto work = scratch(a, B, N, false);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    const auto out = [](torch::Tensor& t) { return t.defined() ? reinterpret_cast<T*>(t.data_ptr()) : nullptr; };
    launch_bk_core_forward<T>(a.data_ptr<T>(), b.data_ptr<T>(), c.data_ptr<T>(),
                              reinterpret_cast<const T*>(zb.data_ptr()), out(g), out(r), out(s), B, N,
                              mode == BkCoreMode::kMixed, causal, work.data_ptr(), stream);
  };
  if (a.scalar_type() == torch::kFloat64)
    run(double{});
  else
    run(float{});
  return {g, r, s};
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
  auto gz_part = torch::empty({B, bk_core_tiles(N)}, g.options());
  auto work = scratch(b, B, N, true);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    const auto cp = [](const torch::Tensor& t) { return reinterpret_cast<const T*>(t.data_ptr()); };
    const auto mp = [](torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); };
    launch_bk_core_backward<T>(cp(gg), cp(b), cp(c), cp(g), cp(r), cp(s), mp(ga), mp(gb), mp(gc), mp(gz_part), B, N,
                               causal, work.data_ptr(), stream);
  };
  if (b.scalar_type() == torch::kFloat64)
    run(double{});
  else
    run(float{});
  return {ga, gb, gc, gz_part.sum(1)};
}

const BkCoreCudaOps kOps{&forward_cuda, &backward_cuda};

struct Register {
  Register() { bk_core_cuda_ops() = &kOps; }
} register_bk_core_cuda;

}  // namespace
}  // namespace tandem::detail
