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

// The bias in w's dtype, contiguous, or undefined.
torch::Tensor bias_of(const torch::Tensor& bias, const torch::Tensor& w, int64_t outputs) {
  if (!bias.defined()) return {};
  TANDEM_ASSERT(bias.numel() == outputs, "a bias of ", bias.numel(), " for ", outputs, " outputs");
  return bias.to(w.scalar_type()).contiguous();
}

// The launch of a normed product's input (Note [Norm in the product]): its tensors kept alive, r
// allocated where there is an add.
struct NormLaunch {
  torch::Tensor stream, added, scale, r;
  NormArgs args;
};

NormLaunch norm_launch(const NormedInput& in, ElementType elem) {
  NormLaunch l;
  l.stream = in.stream.contiguous();
  l.scale = in.scale.to(torch::kFloat32).contiguous();
  NormArgs& p = l.args;
  p.x = l.stream.data_ptr<float>();
  p.w = l.scale.data_ptr<float>();
  p.rows = l.stream.size(0), p.C = l.stream.size(1);
  p.eps = static_cast<float>(in.eps);
  p.plus_one = in.plus_one;
  if (in.added.defined()) {
    l.added = in.added.contiguous();
    l.r = torch::empty_like(l.stream);
    p.a = l.added.data_ptr();
    p.a_elem = elem;
    p.r = l.r.data_ptr<float>();
  } else {
    l.r = in.stream;
  }
  return l;
}

std::pair<torch::Tensor, torch::Tensor> silu_mul_cuda(const NormedInput* in, const torch::Tensor& x,
                                                      const torch::Tensor& w, const torch::Tensor& bias_in) {
  const c10::cuda::CUDAGuard guard(w.device());
  const ElementType elem = checked_element_type(w.scalar_type(), "the skinny epilogues");
  const int64_t F = w.size(0) / 2, N = in != nullptr ? in->stream.size(0) : x.size(0);
  const auto bias = bias_of(bias_in, w, w.size(0));
  auto out = torch::empty({N, F}, w.options());
  const void* b = bias.defined() ? bias.data_ptr() : nullptr;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (in == nullptr) {
    launch_skinny_silu_mul(nullptr, x.data_ptr(), w.data_ptr(), b, out.data_ptr(), N, x.size(1), F, elem, stream);
    return {{}, out};
  }
  const auto norm = norm_launch(*in, elem);
  launch_skinny_silu_mul(&norm.args, nullptr, w.data_ptr(), b, out.data_ptr(), N, w.size(1), F, elem, stream);
  return {norm.r, out};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> rope_kv_cuda(
    const NormedInput* in, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias_in, int64_t heads,
    int64_t kv_heads, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& k_cache,
    torch::Tensor& v_cache, const torch::Tensor& page, const torch::Tensor& slot) {
  const c10::cuda::CUDAGuard guard(w.device());
  const int64_t N = in != nullptr ? in->stream.size(0) : x.size(0);
  auto launch =
      rope_kv_launch("skinny_rope_kv", w, N, w.size(0), heads, kv_heads, cos, sin, k_cache, v_cache, page, slot);
  const auto bias = bias_of(bias_in, w, w.size(0));
  auto v = torch::empty_like(launch.k);
  SkinnyRopeKvArgs p;
  p.rope = launch.args;
  p.w = w.data_ptr();
  p.bias = bias.defined() ? bias.data_ptr() : nullptr;
  p.v_out = v.data_ptr();
  p.K = w.size(1);
  NormLaunch norm;
  if (in != nullptr) {
    norm = norm_launch(*in, p.rope.elem);
    p.norm = norm.args;
  } else {
    p.x = x.data_ptr();
  }
  launch_skinny_rope_kv(p, c10::cuda::getCurrentCUDAStream());
  return {norm.r, launch.q, launch.k, v};
}

const SkinnyEpiloguesCudaOps kOps{&silu_mul_cuda, &rope_kv_cuda};

struct Register {
  Register() { skinny_epilogues_cuda_ops() = &kOps; }
} register_skinny_epilogues_cuda;

}  // namespace
}  // namespace tandem::detail
