// The decode fusions for CUDA tensors: shapes and outputs in LibTorch, the kernels in
// decode_fusions.cu on the current stream (Note [Decode fusions]). Registered at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/core/error.h"
#include "tandem/kernels/decode_fusions.h"
#include "tandem/kernels/decode_fusions_launch.h"
#include "tandem/kernels/element_type_of.h"
#include "tandem/kernels/rope_kv_cuda.h"

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
                                                           const torch::Tensor& cos, const torch::Tensor& sin,
                                                           torch::Tensor& k_cache, torch::Tensor& v_cache,
                                                           const torch::Tensor& page, const torch::Tensor& slot) {
  const c10::cuda::CUDAGuard guard(qkv_in.device());
  const auto qkv = qkv_in.contiguous();
  auto launch = rope_kv_launch("rope_write_kv", qkv, qkv.size(0), qkv.size(1), heads, kv_heads, cos, sin, k_cache,
                               v_cache, page, slot);
  launch.args.qkv = qkv.data_ptr();
  launch_rope_write_kv(launch.args, c10::cuda::getCurrentCUDAStream());
  return {launch.q, launch.k};
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

RopeKvLaunch rope_kv_launch(const char* what, const torch::Tensor& like, int64_t rows, int64_t width, int64_t heads,
                            int64_t kv_heads, const torch::Tensor& cos, const torch::Tensor& sin,
                            torch::Tensor& k_cache, torch::Tensor& v_cache, const torch::Tensor& page,
                            const torch::Tensor& slot) {
  const int64_t N = rows, hd = k_cache.size(3), rot = cos.size(-1);
  TANDEM_ASSERT(width == (heads + 2 * kv_heads) * hd && k_cache.size(1) == kv_heads && k_cache.is_contiguous() &&
                    v_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() && rot <= hd && rot % 2 == 0 &&
                    hd % 2 == 0,
                what, ": a projection of ", width, ", ", heads, " heads over ", kv_heads, ", cache ", k_cache.sizes(),
                ", rotary ", rot);
  const auto t = like.scalar_type();
  TANDEM_ASSERT(k_cache.scalar_type() == t && v_cache.scalar_type() == t && cos.scalar_type() == t &&
                    sin.scalar_type() == t,
                what, ": the caches and the tables in the projection's dtype");
  RopeKvLaunch l;
  l.cos = cos.reshape({N, rot}).contiguous();
  l.sin = sin.reshape({N, rot}).contiguous();
  l.page = page.to(torch::kInt64).contiguous();
  l.slot = slot.to(torch::kInt64).contiguous();
  l.q = torch::empty({N, heads, hd}, like.options());
  l.k = torch::empty({N, kv_heads, hd}, like.options());
  RopeKvArgs& p = l.args;
  p.cos = l.cos.data_ptr();
  p.sin = l.sin.data_ptr();
  p.q_out = l.q.data_ptr();
  p.k_out = l.k.data_ptr();
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.page = l.page.data_ptr<int64_t>();
  p.slot = l.slot.data_ptr<int64_t>();
  p.N = N, p.H = heads, p.KV = kv_heads, p.head_dim = hd, p.rotary = rot, p.page_tokens = k_cache.size(2);
  p.elem = checked_element_type(t, what);
  return l;
}
}  // namespace tandem::detail
