#include "tandem/models/attention.h"

#include <cmath>
#include <limits>

namespace tandem {

torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                     const AttentionOptions& o) {
  const bool gqa = k.size(1) != q.size(1);
  const std::optional<double> scale = o.scale > 0 ? std::optional<double>(o.scale) : std::nullopt;
  if (o.softcap <= 0)
    return at::scaled_dot_product_attention(q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt,
                                            /*dropout_p=*/0.0, /*is_causal=*/!mask.defined(), scale, gqa);
  const int64_t groups = q.size(1) / k.size(1);
  const auto kk = gqa ? k.repeat_interleave(groups, 1) : k;
  const auto vv = gqa ? v.repeat_interleave(groups, 1) : v;
  auto scores = torch::matmul(q, kk.transpose(-2, -1)) * scale.value_or(1.0 / std::sqrt(double(q.size(-1))));
  scores = torch::tanh(scores / o.softcap) * o.softcap;
  const auto allowed = mask.defined() ? mask : causal_mask(q.size(2), 0, q.device());
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1, torch::kFloat32).to(vv.scalar_type()), vv);
}

torch::Tensor within_window(const torch::Tensor& keys, const torch::Tensor& queries, int64_t window) {
  TORCH_CHECK(window > 0, "within_window needs a window");
  return keys > queries - window;
}

torch::Tensor causal_mask(int64_t T, int64_t window, const c10::Device& device) {
  const auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(device));
  const auto keys = pos.view({1, T}), queries = pos.view({T, 1});
  auto m = keys <= queries;
  return window > 0 ? m & within_window(keys, queries, window) : m;
}

}  // namespace tandem
