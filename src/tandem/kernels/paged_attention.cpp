// Paged decode attention: the dispatch and the fp32 reference (Note [Paged decode attention]).

#include "tandem/kernels/paged_attention.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"

namespace tandem {
namespace detail {

const PagedAttentionCudaOps*& paged_attention_cuda_ops() {
  static const PagedAttentionCudaOps* ops = nullptr;
  return ops;
}

torch::Tensor paged_decode_attention_reference(const torch::Tensor& q, const torch::Tensor& k_cache,
                                               const torch::Tensor& v_cache, const torch::Tensor& pages,
                                               const torch::Tensor& lengths, int64_t window, double scale) {
  const int64_t B = q.size(0), H = q.size(1), hd = q.size(2), KV = k_cache.size(1), pt = k_cache.size(2);
  const auto page_ids = pages.to(torch::kCPU, torch::kInt64).contiguous();
  const auto lens = lengths.to(torch::kCPU, torch::kInt64).contiguous();
  auto out = torch::empty({B, H, hd}, q.options().dtype(torch::kFloat32));
  const auto index = torch::TensorOptions().dtype(torch::kInt64);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens.data_ptr<int64_t>()[b];
    const int64_t lo = window > 0 ? std::max<int64_t>(0, len - window) : 0;
    const auto pos = torch::arange(lo, len, index);
    const auto page = page_ids[b].index_select(0, torch::div(pos, pt, "floor")).to(q.device());
    const auto slot = torch::remainder(pos, pt).to(q.device());
    using torch::indexing::Slice;
    const auto keys = k_cache.index({page, Slice(), slot}).to(torch::kFloat32);  // (n, KV, hd)
    const auto values = v_cache.index({page, Slice(), slot}).to(torch::kFloat32);
    const auto query = q[b].to(torch::kFloat32).view({KV, H / KV, hd});
    const auto scores = torch::einsum("kgd,nkd->kgn", {query, keys}) * scale;
    const auto weights = torch::softmax(scores, -1);
    out[b].copy_(torch::einsum("kgn,nkd->kgd", {weights, values}).reshape({H, hd}));
  }
  return out.to(q.scalar_type());
}

}  // namespace detail

bool paged_decode_attention_supported(const c10::Device& device, torch::ScalarType dtype, int64_t heads,
                                      int64_t kv_heads, int64_t head_dim) {
  const auto* ops = detail::paged_attention_cuda_ops();
  return device.is_cuda() && ops != nullptr && ops->supported(dtype, heads, kv_heads, head_dim);
}

torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                     const torch::Tensor& pages, const torch::Tensor& lengths, int64_t window,
                                     double scale) {
  TANDEM_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
               "paged decode attention takes q (B, H, hd) and caches (P, KV, page_tokens, hd); got q ", q.sizes(),
               ", keys ", k_cache.sizes(), ", values ", v_cache.sizes());
  TANDEM_CHECK(k_cache.size(3) == q.size(2) && q.size(1) % k_cache.size(1) == 0, "paged decode attention: head_dim ",
               q.size(2), " against the cache's ", k_cache.size(3), ", ", q.size(1), " query heads over ",
               k_cache.size(1), " key/value heads");
  TANDEM_CHECK(pages.dim() == 2 && pages.size(0) == q.size(0) && lengths.numel() == q.size(0),
               "paged decode attention: ", q.size(0), " queries, pages ", pages.sizes(), ", lengths ", lengths.sizes());
  if (paged_decode_attention_supported(q.device(), q.scalar_type(), q.size(1), k_cache.size(1), q.size(2)))
    return detail::paged_attention_cuda_ops()->decode(q, k_cache, v_cache, pages, lengths, window, scale);
  return detail::paged_decode_attention_reference(q, k_cache, v_cache, pages, lengths, window, scale);
}

}  // namespace tandem
