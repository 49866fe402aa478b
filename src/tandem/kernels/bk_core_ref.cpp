// The BK-core reference: Note [BK-core ratio form] in long double, row by row.

#include <complex>

#include "tandem/core/error.h"
#include "tandem/kernels/bk_core.h"

namespace tandem::detail {

torch::Tensor bk_core_reference(const torch::Tensor& a_in, const torch::Tensor& b_in, const torch::Tensor& c_in,
                                const torch::Tensor& z_in) {
  bk_core_validate(a_in, b_in, c_in, z_in);  // N >= 1 and the shapes: the loops below index by them
  using C = std::complex<long double>;
  const auto a = a_in.to(torch::kCPU, torch::kFloat64).contiguous();
  const auto b = b_in.to(torch::kCPU, torch::kFloat64).contiguous();
  const auto c = c_in.to(torch::kCPU, torch::kFloat64).contiguous();
  const int64_t B = a.size(0), N = a.size(1);
  const auto z = z_in.resolve_conj().resolve_neg().to(torch::kCPU, torch::kComplexDouble).expand({B}).contiguous();
  auto out = torch::empty({B, N}, torch::kComplexDouble);
  const double* pa = a.data_ptr<double>();
  const double* pb = b.data_ptr<double>();
  const double* pc = c.data_ptr<double>();
  const auto* pz = z.data_ptr<c10::complex<double>>();
  auto* po = out.data_ptr<c10::complex<double>>();
  std::vector<C> r(N), s(N);
  for (int64_t row = 0; row < B; ++row) {
    const double* ar = pa + row * N;
    const double* br = pb + row * (N - 1);
    const double* cr = pc + row * (N - 1);
    const C zz(pz[row].real(), pz[row].imag());
    auto d = [&](int64_t i) { return C(ar[i]) - zz; };
    auto p = [&](int64_t i) { return C(static_cast<long double>(br[i]) * static_cast<long double>(cr[i])); };
    r[0] = d(0);
    for (int64_t i = 1; i < N; ++i) r[i] = d(i) - p(i - 1) / r[i - 1];
    s[N - 1] = d(N - 1);
    for (int64_t i = N - 2; i >= 0; --i) s[i] = d(i) - p(i) / s[i + 1];
    for (int64_t i = 0; i < N; ++i) {
      const C g = C(1) / (r[i] + s[i] - d(i));
      po[row * N + i] = c10::complex<double>(static_cast<double>(g.real()), static_cast<double>(g.imag()));
    }
  }
  return out;
}

}  // namespace tandem::detail
