// Paged decode attention for CUDA tensors: shapes, dtypes and scratch in LibTorch, the kernels in
// paged_attention.cu on the current stream (Note [Paged decode attention]). Registered into
// paged_decode_attention() at load time.

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>

#include "tandem/core/error.h"
#include "tandem/kernels/element_type_of.h"
#include "tandem/kernels/paged_attention.h"
#include "tandem/kernels/paged_attention_launch.h"

namespace tandem::detail {
namespace {

bool supported(torch::ScalarType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  ElementType elem;
  return element_type_of(dtype, &elem) && kv_heads > 0 && heads % kv_heads == 0 &&
         paged_decode_shape_supported(head_dim, heads / kv_heads);
}

torch::Tensor decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                     const torch::Tensor& pages, const torch::Tensor& lengths, int64_t window, double scale) {
  const c10::cuda::CUDAGuard guard(q.device());
  TANDEM_ASSERT(q.stride(2) == 1 && k_cache.is_contiguous() && v_cache.is_contiguous(),
                "paged decode attention needs rows of q and whole caches contiguous");
  TANDEM_ASSERT(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
                "paged decode attention: the cache's dtype differs from the queries'");
  const auto page_ids = pages.to(torch::kInt64).contiguous();
  const auto lens = lengths.to(torch::kInt64).contiguous();
  PagedDecodeArgs a;
  element_type_of(q.scalar_type(), &a.elem);
  a.B = q.size(0);
  a.H = q.size(1);
  a.head_dim = q.size(2);
  a.KV = k_cache.size(1);
  a.page_tokens = k_cache.size(2);
  a.q = q.data_ptr();
  a.q_stride_b = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.k_cache = k_cache.data_ptr();
  a.v_cache = v_cache.data_ptr();
  a.pages = page_ids.data_ptr<int64_t>();
  a.pages_stride = page_ids.size(1);
  a.lengths = lens.data_ptr<int64_t>();
  a.window = window;
  a.scale = static_cast<float>(scale);
  int64_t max_keys = page_ids.size(1) * a.page_tokens;
  if (window > 0) max_keys = std::min(max_keys, window);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  a.splits = paged_decode_splits(a.B, a.KV, max_keys, sms, &a.split_keys);
  auto out = torch::empty({a.B, a.H, a.head_dim}, q.options());
  a.out = out.data_ptr();
  torch::Tensor partial;
  if (a.splits > 1) {
    partial = torch::empty({a.B, a.H, a.splits, a.head_dim + 2}, q.options().dtype(torch::kFloat32));
    a.partial = partial.data_ptr<float>();
  }
  launch_paged_decode(a, c10::cuda::getCurrentCUDAStream());
  return out;
}

const PagedAttentionCudaOps kOps{&supported, &decode};

struct Register {
  Register() { paged_attention_cuda_ops() = &kOps; }
} register_paged_attention_cuda;

}  // namespace
}  // namespace tandem::detail
