// The BK-core reference (the fast paths' oracle) on its own: against the dense inverse (a complex
// spectrum included), the closed-form resolvent of a constant tridiagonal matrix at N = 1000, its
// input conversions, and the symmetries of the resolvent's diagonal.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "../test_util.h"
#include "tandem/kernels/bk_core.h"

namespace tandem {
namespace {

constexpr double kF64Eps = std::numeric_limits<double>::epsilon();

// diag((H - z I)^-1) of one row by a dense inverse in complex128.
torch::Tensor dense_diagonal(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                             const torch::Tensor& z) {
  const int64_t N = a.size(0);
  auto H = torch::diag(a.to(torch::kFloat64)).to(torch::kComplexDouble);
  if (N > 1) H = H + torch::diag(b.to(torch::kFloat64), 1) + torch::diag(c.to(torch::kFloat64), -1);
  const auto zz = z.to(torch::kComplexDouble);
  return torch::diagonal(torch::linalg_inv(H - zz * torch::eye(N, torch::kComplexDouble)));
}

// |got - want| <= tol * |want| for every complex element; names the worst.
::testing::AssertionResult RelativelyClose(const torch::Tensor& got, const torch::Tensor& want, double tol) {
  const auto err = (got.to(torch::kComplexDouble) - want).abs() / want.abs();
  const int64_t worst = err.flatten().argmax().item<int64_t>();
  const double e = err.flatten()[worst].item<double>();
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "worst relative error " << e << " at flat index " << worst << " (tolerance "
                                       << tol << ")";
}

TEST(BkCoreReference, EqualsTheDenseInverseForSymmetrisableH) {
  for (const int64_t N : {1, 2, 7, 17, 200}) {
    torch::manual_seed(N);
    const int64_t B = 3;
    const auto a = torch::rand({B, N}, torch::kFloat64) * 2 - 1;
    const auto b = 0.2 + torch::rand({B, N - 1}, torch::kFloat64) * 0.8;
    const auto c = 0.2 + torch::rand({B, N - 1}, torch::kFloat64) * 0.8;
    const auto z = torch::complex(torch::rand({B}, torch::kFloat64) - 0.5, 0.5 + torch::rand({B}, torch::kFloat64));
    const auto g = detail::bk_core_reference(a, b, c, z);
    ASSERT_EQ(g.scalar_type(), torch::kComplexDouble);
    ASSERT_EQ(g.sizes(), (std::vector<int64_t>{B, N}));
    for (int64_t row = 0; row < B; ++row)
      EXPECT_TRUE(RelativelyClose(g[row], dense_diagonal(a[row], b[row], c[row], z[row]), 1e-12))
          << "N=" << N << " row " << row;
  }
}

// b_i c_i < 0: H is not similar to a symmetric matrix and has complex eigenvalues; |H| <= 2 by
// Gershgorin, so z = 0.3 + 3i stays at distance >= 1 from the spectrum.
TEST(BkCoreReference, EqualsTheDenseInverseForANonSymmetricH) {
  for (const int64_t N : {7, 17, 64}) {
    torch::manual_seed(100 + N);
    const auto a = torch::rand({2, N}, torch::kFloat64) * 2 - 1;
    const auto b = torch::rand({2, N - 1}, torch::kFloat64) * 0.5;
    const auto c = -torch::rand({2, N - 1}, torch::kFloat64) * 0.5;
    const auto z = torch::complex(torch::tensor(0.3, torch::kFloat64), torch::tensor(3.0, torch::kFloat64));
    const auto g = detail::bk_core_reference(a, b, c, z);
    for (int64_t row = 0; row < 2; ++row)
      EXPECT_TRUE(RelativelyClose(g[row], dense_diagonal(a[row], b[row], c[row], z), 1e-12))
          << "N=" << N << " row " << row;
  }
}

// H = tridiag(beta, alpha, beta) has eigenvalues alpha + 2 beta cos(k pi / (N+1)) with eigenvectors
// sqrt(2 / (N+1)) sin(i k pi / (N+1)), so G_ii = 2/(N+1) sum_k sin^2(i k pi / (N+1)) / (lambda_k - z)
// (i, k = 1 .. N).
TEST(BkCoreReference, MatchesTheClosedFormOfAConstantTridiagonalMatrix) {
  const int64_t N = 1000;
  const double alpha = 0.3, beta = 0.45;
  const c10::complex<double> z(0.2, 0.05);  // inside the band [-0.6, 1.2], close to the spectrum
  const auto k = torch::arange(1, N + 1, torch::kFloat64);
  const auto theta = k * M_PI / double(N + 1);
  const auto lambda = alpha + 2 * beta * torch::cos(theta);     // (N)
  const auto sin2 = torch::sin(torch::outer(k, theta)).pow(2);  // (i, k)
  const auto inv = 1.0 / (lambda.to(torch::kComplexDouble) - torch::scalar_tensor(z, torch::kComplexDouble));
  const auto want = torch::matmul(sin2.to(torch::kComplexDouble), inv) * (2.0 / double(N + 1));
  const auto g = detail::bk_core_reference(
      torch::full({1, N}, alpha, torch::kFloat64), torch::full({1, N - 1}, beta, torch::kFloat64),
      torch::full({1, N - 1}, beta, torch::kFloat64), torch::scalar_tensor(z, torch::kComplexDouble));
  // The sum in double loses about N eps relative to |G| near the spectrum.
  EXPECT_TRUE(RelativelyClose(g[0], want, 1e-10));
}

TEST(BkCoreReference, AnySizeAndTheFirstElementInClosedForm) {
  torch::manual_seed(4);
  const auto a = torch::randn({4, 1}, torch::kFloat64);
  const auto empty = torch::zeros({4, 0}, torch::kFloat64);
  const auto z = torch::complex(torch::randn({4}, torch::kFloat64), torch::rand({4}, torch::kFloat64) + 0.1);
  const auto g = detail::bk_core_reference(a, empty, empty, z);
  EXPECT_TRUE(RelativelyClose(g.squeeze(1), 1.0 / (a.squeeze(1).to(torch::kComplexDouble) - z), 2 * kF64Eps));
  // N = 2: G_00 = (a_1 - z) / ((a_0 - z)(a_1 - z) - b c).
  const auto a2 = torch::tensor({{0.4, -0.7}}, torch::kFloat64);
  const auto b2 = torch::tensor({{0.6}}, torch::kFloat64), c2 = torch::tensor({{-0.25}}, torch::kFloat64);
  const c10::complex<double> zz(0.1, 0.9);
  const auto g2 = detail::bk_core_reference(a2, b2, c2, torch::scalar_tensor(zz, torch::kComplexDouble));
  const std::complex<double> d0(0.4 - 0.1, -0.9), d1(-0.7 - 0.1, -0.9), det = d0 * d1 - 0.6 * -0.25;
  const auto want =
      torch::tensor({c10::complex<double>(d1 / det), c10::complex<double>(d0 / det)}, torch::kComplexDouble);
  EXPECT_TRUE(RelativelyClose(g2[0], want, 4 * kF64Eps));
}

TEST(BkCoreReference, FloatInputsAndAComplex64ZAreWidenedExactly) {
  torch::manual_seed(5);
  const auto a = torch::rand({2, 17}) * 2 - 1, b = 0.2 + torch::rand({2, 16}), c = 0.2 + torch::rand({2, 16});
  const auto z = torch::complex(torch::tensor(0.1f), torch::tensor(0.5f));  // complex64
  const auto g = detail::bk_core_reference(a, b, c, z);
  EXPECT_EQ(g.scalar_type(), torch::kComplexDouble);
  const auto wide = detail::bk_core_reference(a.to(torch::kFloat64), b.to(torch::kFloat64), c.to(torch::kFloat64),
                                              z.to(torch::kComplexDouble));
  EXPECT_TRUE(torch::equal(g, wide));
  // A shared z equals the same z for every row.
  EXPECT_TRUE(torch::equal(detail::bk_core_reference(a, b, c, z.expand({2}).clone()), g));
}

TEST(BkCoreReference, RowsAreIndependent) {
  torch::manual_seed(6);
  const auto a = torch::rand({5, 33}, torch::kFloat64), b = 0.3 + torch::rand({5, 32}, torch::kFloat64);
  const auto c = 0.3 + torch::rand({5, 32}, torch::kFloat64);
  const auto z = torch::complex(torch::rand({5}, torch::kFloat64), 0.5 + torch::rand({5}, torch::kFloat64));
  const auto all = detail::bk_core_reference(a, b, c, z);
  for (int64_t row = 0; row < 5; ++row) {
    const auto one =
        detail::bk_core_reference(a.narrow(0, row, 1), b.narrow(0, row, 1), c.narrow(0, row, 1), z.narrow(0, row, 1));
    EXPECT_TRUE(torch::equal(one[0], all[row])) << row;
  }
}

// The diagonal depends on b and c through their products only, and G(conj z) = conj G(z) for real H.
TEST(BkCoreReference, TheDiagonalsSymmetries) {
  torch::manual_seed(7);
  const auto a = torch::rand({3, 50}, torch::kFloat64) * 2 - 1;
  const auto b = 0.2 + torch::rand({3, 49}, torch::kFloat64), c = 0.2 + torch::rand({3, 49}, torch::kFloat64);
  const auto z = torch::complex(torch::rand({3}, torch::kFloat64) - 0.5, 0.5 + torch::rand({3}, torch::kFloat64));
  const auto g = detail::bk_core_reference(a, b, c, z);
  EXPECT_TRUE(torch::equal(detail::bk_core_reference(a, c, b, z), g)) << "swapping b and c changed G";
  EXPECT_TRUE(torch::equal(detail::bk_core_reference(a, b * 2, c / 2, z), g)) << "(2b, c/2) changed G";
  EXPECT_TRUE(RelativelyClose(detail::bk_core_reference(a, b, c, z.conj()), g.conj(), 4 * kF64Eps));
  // And it is not symmetric in the other sense: negating one off-diagonal changes it.
  EXPECT_FALSE(RelativelyClose(detail::bk_core_reference(a, -b, c, z), g, 1e-3));
}

TEST(BkCoreReference, AnEmptyRowIsRefusedLikeTheKernels) {
  const auto a = torch::zeros({2, 0}, torch::kFloat64), bc = torch::zeros({2, 0}, torch::kFloat64);
  const auto z = torch::complex(torch::zeros({2}, torch::kFloat64), torch::ones({2}, torch::kFloat64));
  const std::string err = test::error_of([&] { detail::bk_core_reference(a, bc, bc, z); });
  EXPECT_NE(err.find("N >= 1"), std::string::npos) << err;
}

}  // namespace
}  // namespace tandem
