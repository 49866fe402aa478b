// BK-core with LibTorch tensor ops: Note [BK-core ratio form], one position at a time over the
// batch column; autograd differentiates it.

#include "tandem/kernels/bk_core.h"

namespace tandem::detail {

torch::Tensor bk_core_ops(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                          const torch::Tensor& z, bool causal) {
  bk_core_validate(a, b, c, z);
  const int64_t B = a.size(0), N = a.size(1);
  const auto ct = bk_core_complex_type(a.scalar_type());
  const auto zb = z.to(a.device(), ct).expand({B});
  const auto d = a.to(ct) - zb.unsqueeze(1);  // (B, N)
  const auto p = (b * c).to(ct);              // (B, N-1)
  std::vector<torch::Tensor> r(N), s(N);
  r[0] = d.select(1, 0);
  for (int64_t i = 1; i < N; ++i) r[i] = d.select(1, i) - p.select(1, i - 1) / r[i - 1];
  s[N - 1] = d.select(1, N - 1);
  for (int64_t i = N - 2; i >= 0; --i) s[i] = causal ? d.select(1, i) : d.select(1, i) - p.select(1, i) / s[i + 1];
  std::vector<torch::Tensor> g(N);
  for (int64_t i = 0; i < N; ++i) g[i] = 1.0 / (r[i] + s[i] - d.select(1, i));
  return torch::stack(g, 1);
}

}  // namespace tandem::detail
