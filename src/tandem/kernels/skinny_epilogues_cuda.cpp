// The skinny epilogues for CUDA tensors: shapes and outputs in LibTorch, the kernels in
// skinny_epilogues.cu on the current stream (Note [Skinny epilogues]). Registered at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/core/error.h"
#include "tandem/kernels/element_type_of.h"
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
    const torch::Tensor& cos_in, const torch::Tensor& sin_in, torch::Tensor& k_cache, torch::Tensor& v_cache,
    const torch::Tensor& page_in, const torch::Tensor& slot_in) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t N = x.size(0), hd = k_cache.size(3), rot = cos_in.size(-1);
  TANDEM_ASSERT(w.size(0) == (heads + 2 * kv_heads) * hd && k_cache.size(1) == kv_heads && k_cache.is_contiguous() &&
                    v_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() && rot <= hd && rot % 2 == 0 &&
                    hd % 2 == 0,
                "skinny_rope_kv: w ", w.sizes(), ", ", heads, " heads over ", kv_heads, ", cache ", k_cache.sizes(),
                ", rotary ", rot);
  TANDEM_ASSERT(k_cache.scalar_type() == x.scalar_type() && v_cache.scalar_type() == x.scalar_type() &&
                    cos_in.scalar_type() == x.scalar_type() && sin_in.scalar_type() == x.scalar_type(),
                "skinny_rope_kv: the caches and the tables in the projection's dtype");
  const auto cos = cos_in.reshape({N, rot}).contiguous(), sin = sin_in.reshape({N, rot}).contiguous();
  const auto page = page_in.to(torch::kInt64).contiguous(), slot = slot_in.to(torch::kInt64).contiguous();
  const auto bias = bias_of(bias_in, x, w.size(0));
  auto q = torch::empty({N, heads, hd}, x.options());
  auto k = torch::empty({N, kv_heads, hd}, x.options()), v = torch::empty({N, kv_heads, hd}, x.options());
  SkinnyRopeKvArgs p;
  p.x = x.data_ptr();
  p.w = w.data_ptr();
  p.bias = bias.defined() ? bias.data_ptr() : nullptr;
  p.cos = cos.data_ptr();
  p.sin = sin.data_ptr();
  p.q_out = q.data_ptr();
  p.k_out = k.data_ptr();
  p.v_out = v.data_ptr();
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.page = page.data_ptr<int64_t>();
  p.slot = slot.data_ptr<int64_t>();
  p.rows = N, p.K = x.size(1), p.H = heads, p.KV = kv_heads, p.head_dim = hd, p.rotary = rot;
  p.page_tokens = k_cache.size(2);
  p.elem = checked_element_type(x.scalar_type(), "the skinny epilogues");
  launch_skinny_rope_kv(p, c10::cuda::getCurrentCUDAStream());
  return {q, k, v};
}

const SkinnyEpiloguesCudaOps kOps{&silu_mul_cuda, &rope_kv_cuda};

struct Register {
  Register() { skinny_epilogues_cuda_ops() = &kOps; }
} register_skinny_epilogues_cuda;

}  // namespace
}  // namespace tandem::detail
