// The decode fusions for CUDA tensors: shapes and outputs in LibTorch, the kernels in
// decode_fusions.cu on the current stream (Note [Decode fusions]). Registered at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/core/error.h"
#include "tandem/kernels/decode_fusions.h"
#include "tandem/kernels/decode_fusions_launch.h"
#include "tandem/kernels/element_type_of.h"

namespace tandem::detail {
namespace {

ElementType element(const torch::Tensor& t) { return checked_element_type(t.scalar_type(), "a fused decode kernel"); }

std::pair<torch::Tensor, torch::Tensor> add_rms_norm_cuda(const torch::Tensor& x_in, const torch::Tensor& a_in,
                                                          const torch::Tensor& w_in, double eps, bool plus_one,
                                                          torch::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.to(torch::kFloat32).contiguous();
  const auto w = w_in.to(torch::kFloat32).contiguous();
  const int64_t C = x.size(-1);
  TANDEM_ASSERT(w.numel() == C && fused_norm_takes(C), "a fused norm of ", C, " features with a scale of ", w.numel());
  NormArgs p;
  p.x = x.data_ptr<float>();
  p.w = w.data_ptr<float>();
  p.rows = x.numel() / std::max<int64_t>(C, 1);
  p.C = C;
  p.eps = static_cast<float>(eps);
  p.plus_one = plus_one;
  torch::Tensor a, r;
  if (a_in.defined()) {
    a = a_in.contiguous();
    TANDEM_ASSERT(a.numel() == x.numel(), "a residual add of ", a.sizes(), " to ", x.sizes());
    r = torch::empty_like(x);
    p.a = a.data_ptr();
    p.a_elem = element(a);
    p.r = r.data_ptr<float>();
  }
  auto out = torch::empty(x.sizes(), x.options().dtype(dtype));
  p.out = out.data_ptr();
  p.out_elem = element(out);
  launch_add_rms_norm(p, c10::cuda::getCurrentCUDAStream());
  return {a_in.defined() ? r : x_in, out};
}

std::pair<torch::Tensor, torch::Tensor> rope_write_kv_cuda(const torch::Tensor& qkv_in, int64_t heads, int64_t kv_heads,
                                                           const torch::Tensor& cos_in, const torch::Tensor& sin_in,
                                                           torch::Tensor& k_cache, torch::Tensor& v_cache,
                                                           const torch::Tensor& page_in, const torch::Tensor& slot_in) {
  const c10::cuda::CUDAGuard guard(qkv_in.device());
  const auto qkv = qkv_in.contiguous();
  const int64_t N = qkv.size(0), hd = k_cache.size(3), rot = cos_in.size(-1);
  TANDEM_ASSERT(qkv.size(1) == (heads + 2 * kv_heads) * hd && k_cache.size(1) == kv_heads && k_cache.is_contiguous() &&
                    v_cache.is_contiguous() && rot <= hd && rot % 2 == 0,
                "rope_write_kv: qkv ", qkv.sizes(), ", ", heads, " heads over ", kv_heads, ", cache ", k_cache.sizes(),
                ", rotary ", rot);
  TANDEM_ASSERT(k_cache.scalar_type() == qkv.scalar_type() && cos_in.scalar_type() == qkv.scalar_type(),
                "rope_write_kv: the cache and the tables in the projection's dtype");
  const auto cos = cos_in.reshape({N, rot}).contiguous(), sin = sin_in.reshape({N, rot}).contiguous();
  const auto page = page_in.to(torch::kInt64).contiguous(), slot = slot_in.to(torch::kInt64).contiguous();
  auto q = torch::empty({N, heads, hd}, qkv.options()), k = torch::empty({N, kv_heads, hd}, qkv.options());
  RopeKvArgs p;
  p.qkv = qkv.data_ptr();
  p.cos = cos.data_ptr();
  p.sin = sin.data_ptr();
  p.q_out = q.data_ptr();
  p.k_out = k.data_ptr();
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.page = page.data_ptr<int64_t>();
  p.slot = slot.data_ptr<int64_t>();
  p.N = N, p.H = heads, p.KV = kv_heads, p.head_dim = hd, p.rotary = rot, p.page_tokens = k_cache.size(2);
  p.elem = element(qkv);
  launch_rope_write_kv(p, c10::cuda::getCurrentCUDAStream());
  return {q, k};
}

torch::Tensor silu_mul_cuda(const torch::Tensor& gu_in) {
  const c10::cuda::CUDAGuard guard(gu_in.device());
  const auto gu = gu_in.contiguous();
  const int64_t N = gu.size(0), F = gu.size(1) / 2;
  auto out = torch::empty({N, F}, gu.options());
  launch_silu_mul(gu.data_ptr(), out.data_ptr(), N, F, element(gu), c10::cuda::getCurrentCUDAStream());
  return out;
}

const DecodeFusionsCudaOps kOps{&add_rms_norm_cuda, &rope_write_kv_cuda, &silu_mul_cuda};

struct Register {
  Register() { decode_fusions_cuda_ops() = &kOps; }
} register_decode_fusions_cuda;

}  // namespace
}  // namespace tandem::detail
