// The skinny epilogues for CUDA tensors: shapes and outputs in LibTorch, the kernels in
// skinny_epilogues.cu on the current stream (Note [Skinny epilogues]). Registered at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/core/error.h"
#include "tandem/kernels/element_type_of.h"
#include "tandem/kernels/rope_kv_cuda.h"
#include "tandem/kernels/skinny_epilogues.h"
#include "tandem/kernels/skinny_epilogues_launch.h"

namespace tandem::detail {
namespace {

// The bias in x's dtype, contiguous, or undefined.
torch::Tensor bias_of(const torch::Tensor& bias, const torch::Tensor& x, int64_t outputs) {
  if (!bias.defined()) return {};
  TANDEM_ASSERT(bias.numel() == outputs, "a bias of ", bias.numel(), " for ", outputs, " outputs");
  return bias.to(x.scalar_type()).contiguous();
}

torch::Tensor silu_mul_cuda(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias_in) {
  const c10::cuda::CUDAGuard guard(x.device());
  const ElementType elem = checked_element_type(x.scalar_type(), "the skinny epilogues");
  const int64_t F = w.size(0) / 2;
  const auto bias = bias_of(bias_in, x, w.size(0));
  auto out = torch::empty({x.size(0), F}, x.options());
  launch_skinny_silu_mul(x.data_ptr(), w.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr, out.data_ptr(),
                         x.size(0), x.size(1), F, elem, c10::cuda::getCurrentCUDAStream());
  return out;
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> rope_kv_cuda(
    const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias_in, int64_t heads, int64_t kv_heads,
    const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& k_cache, torch::Tensor& v_cache,
    const torch::Tensor& page, const torch::Tensor& slot) {
  const c10::cuda::CUDAGuard guard(x.device());
  auto launch = rope_kv_launch("skinny_rope_kv", x, x.size(0), w.size(0), heads, kv_heads, cos, sin, k_cache, v_cache,
                               page, slot);
  const auto bias = bias_of(bias_in, x, w.size(0));
  auto v = torch::empty_like(launch.k);
  SkinnyRopeKvArgs p;
  p.rope = launch.args;
  p.x = x.data_ptr();
  p.w = w.data_ptr();
  p.bias = bias.defined() ? bias.data_ptr() : nullptr;
  p.v_out = v.data_ptr();
  p.K = x.size(1);
  launch_skinny_rope_kv(p, c10::cuda::getCurrentCUDAStream());
  return {launch.q, launch.k, v};
}

const SkinnyEpiloguesCudaOps kOps{&silu_mul_cuda, &rope_kv_cuda};

struct Register {
  Register() { skinny_epilogues_cuda_ops() = &kOps; }
} register_skinny_epilogues_cuda;

}  // namespace
}  // namespace tandem::detail
