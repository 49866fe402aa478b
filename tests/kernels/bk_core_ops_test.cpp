// BK-core in LibTorch ops (detail::bk_core_ops, the fallback and benchmark baseline) on its own: the
// long-double reference for N = 1 .. 200, the causal diagonal as each leading block's resolvent and
// earlier positions only, autograd against finite differences, dtypes, refusals.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../test_util.h"
#include "bk_core_inputs.h"
#include "tandem/kernels/bk_core.h"

namespace tandem {
namespace {

using Inputs = test::BkCoreInputs;

// |got - want| <= tol * |want| for every complex element; names the worst.
::testing::AssertionResult RelativelyClose(const torch::Tensor& got, const torch::Tensor& want, double tol) {
  if (got.sizes() != want.sizes())
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " != " << want.sizes();
  const auto err = ((got.to(torch::kComplexDouble) - want.to(torch::kComplexDouble)).abs() / want.abs()).flatten();
  const int64_t worst = err.argmax().item<int64_t>();
  const double e = err[worst].item<double>();
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "worst relative error " << e << " at flat index " << worst << ": got "
                                       << got.flatten()[worst].item() << ", want " << want.flatten()[worst].item()
                                       << " (tolerance " << tol << ")";
}

constexpr double kF64Eps = std::numeric_limits<double>::epsilon();
constexpr double kF32Eps = std::numeric_limits<float>::epsilon();

TEST(BkCoreOps, EqualsTheLongDoubleReferenceForAnySize) {
  for (const int64_t N : {1, 2, 7, 17, 200})
    for (const bool z_per_row : {false, true}) {
      const Inputs in = test::random_bk_core_inputs(3, N, torch::kFloat64, 10 + N, z_per_row);
      const auto g = detail::bk_core_ops(in.a, in.b, in.c, in.z);
      EXPECT_EQ(g.scalar_type(), torch::kComplexDouble);
      EXPECT_TRUE(RelativelyClose(g, detail::bk_core_reference(in.a, in.b, in.c, in.z), 64 * kF64Eps))
          << "N=" << N << (z_per_row ? ", z per row" : ", one z");
    }
}

TEST(BkCoreOps, FloatInputsSweepInComplex64WithinItsPrecision) {
  for (const int64_t N : {1, 7, 17, 200}) {
    const Inputs in = test::random_bk_core_inputs(2, N, torch::kFloat32, 20 + N, true);
    const auto g = detail::bk_core_ops(in.a, in.b, in.c, in.z);
    EXPECT_EQ(g.scalar_type(), torch::kComplexFloat);
    // The reference widens the same float inputs, so only the sweep's rounding differs.
    EXPECT_TRUE(RelativelyClose(g, detail::bk_core_reference(in.a, in.b, in.c, in.z), 64 * kF32Eps)) << "N=" << N;
  }
}

TEST(BkCoreOps, ASingleElementIsTheReciprocalOfAMinusZ) {
  const Inputs in = test::random_bk_core_inputs(4, 1, torch::kFloat64, 3, true);
  const auto want = 1.0 / (in.a.to(torch::kComplexDouble) - in.z.unsqueeze(1));
  for (const bool causal : {false, true})
    EXPECT_TRUE(torch::equal(detail::bk_core_ops(in.a, in.b, in.c, in.z, causal), want)) << "causal " << causal;
}

// Entry i of the causal diagonal is the last diagonal entry of the resolvent of H's leading
// (i+1) x (i+1) block: the reference of the first i+1 positions.
TEST(BkCoreOps, TheCausalDiagonalIsTheLastEntryOfEachLeadingBlocksResolvent) {
  const int64_t N = 17;
  const Inputs in = test::random_bk_core_inputs(2, N, torch::kFloat64, 5, true);
  const auto g = detail::bk_core_ops(in.a, in.b, in.c, in.z, /*causal=*/true);
  ASSERT_EQ(g.sizes(), (std::vector<int64_t>{2, N}));
  auto want = torch::empty({2, N}, torch::kComplexDouble);
  for (int64_t i = 0; i < N; ++i)
    want.select(1, i).copy_(
        detail::bk_core_reference(in.a.narrow(1, 0, i + 1), in.b.narrow(1, 0, i), in.c.narrow(1, 0, i), in.z)
            .select(1, i));
  EXPECT_TRUE(RelativelyClose(g, want, 64 * kF64Eps));
  EXPECT_TRUE(torch::equal(g.select(1, N - 1), detail::bk_core_ops(in.a, in.b, in.c, in.z).select(1, N - 1)))
      << "the last position's block is H itself";
}

TEST(BkCoreOps, ACausalEntryDependsOnItsOwnAndEarlierPositionsOnly) {
  const int64_t N = 12, j = 7;
  const Inputs in = test::random_bk_core_inputs(2, N, torch::kFloat64, 9, false);
  const auto base = detail::bk_core_ops(in.a, in.b, in.c, in.z, true);
  // a_j enters entries j and on; b_j and c_j (the coupling of j and j + 1) entries j + 1 and on.
  struct Change {
    const char* what;
    int64_t first_affected;
  };
  for (const Change ch : {Change{"a", j}, Change{"b", j + 1}, Change{"c", j + 1}}) {
    Inputs moved = in;
    torch::Tensor& t = ch.what[0] == 'a' ? moved.a : ch.what[0] == 'b' ? moved.b : moved.c;
    t = t.clone();
    t.select(1, j).add_(0.125);
    const auto g = detail::bk_core_ops(moved.a, moved.b, moved.c, moved.z, true);
    EXPECT_TRUE(torch::equal(g.narrow(1, 0, ch.first_affected), base.narrow(1, 0, ch.first_affected)))
        << "changing " << ch.what << "[" << j << "] moved an earlier entry";
    EXPECT_FALSE(torch::equal(g.select(1, ch.first_affected), base.select(1, ch.first_affected)))
        << "changing " << ch.what << "[" << j << "] left entry " << ch.first_affected << " as it was";
  }
  // The full diagonal couples every position to every other.
  Inputs moved = in;
  moved.a = in.a.clone();
  moved.a.select(1, N - 1).add_(0.125);
  EXPECT_FALSE(torch::equal(detail::bk_core_ops(moved.a, moved.b, moved.c, moved.z).select(1, 0),
                            detail::bk_core_ops(in.a, in.b, in.c, in.z).select(1, 0)));
}

// d Re(sum(G * conj(W))) / d x by central differences, x each of a, b, c and Re z.
TEST(BkCoreOps, AutogradMatchesCentralFiniteDifferences) {
  const int64_t N = 6;
  for (const bool causal : {false, true}) {
    const Inputs in = test::random_bk_core_inputs(2, N, torch::kFloat64, 13, true);
    torch::manual_seed(99);
    const auto W = torch::randn({2, N}, torch::kComplexDouble);
    auto a = in.a.clone().requires_grad_(true), b = in.b.clone().requires_grad_(true),
         c = in.c.clone().requires_grad_(true), z = in.z.clone().requires_grad_(true);
    const auto f = [&](const torch::Tensor& aa, const torch::Tensor& bb, const torch::Tensor& cc,
                       const torch::Tensor& zz) {
      return torch::real(detail::bk_core_ops(aa, bb, cc, zz, causal) * W.conj()).sum();
    };
    f(a, b, c, z).backward();
    torch::NoGradGuard no_grad;
    const double h = 1e-6;
    const torch::Tensor* vars[] = {&in.a, &in.b, &in.c};
    const torch::Tensor grads[] = {a.grad(), b.grad(), c.grad()};
    for (int v = 0; v < 3; ++v) {
      auto fd = torch::empty_like(*vars[v]);
      for (int64_t k = 0; k < vars[v]->numel(); ++k) {
        auto plus = vars[v]->clone(), minus = vars[v]->clone();
        plus.view(-1)[k] += h;
        minus.view(-1)[k] -= h;
        const auto args = [&](const torch::Tensor& x) {
          return f(v == 0 ? x : in.a, v == 1 ? x : in.b, v == 2 ? x : in.c, in.z).item<double>();
        };
        fd.view(-1)[k] = (args(plus) - args(minus)) / (2 * h);
      }
      EXPECT_TRUE(test::AllClose(grads[v], fd, 1e-6, 1e-8)) << "input "
                                                            << "abc"[v] << (causal ? " causal" : "");
    }
    // z: the real part's derivative is the real part of the (conjugate Wirtinger) gradient torch stores.
    auto fd_z = torch::empty({2}, torch::kFloat64);
    for (int64_t k = 0; k < 2; ++k) {
      auto plus = in.z.clone(), minus = in.z.clone();
      plus[k] += h;
      minus[k] -= h;
      fd_z[k] = (f(in.a, in.b, in.c, plus).item<double>() - f(in.a, in.b, in.c, minus).item<double>()) / (2 * h);
    }
    EXPECT_TRUE(test::AllClose(torch::real(z.grad()), fd_z, 1e-6, 1e-8)) << "Re z" << (causal ? " causal" : "");
  }
}

TEST(BkCoreOps, AComplex64ShiftIsWidenedForDoubleInputs) {
  Inputs in = test::random_bk_core_inputs(2, 9, torch::kFloat64, 17, false);
  const auto z128 = torch::complex(torch::tensor(0.25, torch::kFloat64), torch::tensor(0.75, torch::kFloat64));
  const auto g128 = detail::bk_core_ops(in.a, in.b, in.c, z128);
  const auto g64 = detail::bk_core_ops(in.a, in.b, in.c, z128.to(torch::kComplexFloat));
  EXPECT_EQ(g64.scalar_type(), torch::kComplexDouble) << "the inputs' precision decides";
  EXPECT_TRUE(torch::equal(g64, g128)) << "0.25 + 0.75i is exact in both";
  EXPECT_TRUE(torch::equal(detail::bk_core_ops(in.a, in.b, in.c, z128.expand({2}).clone()), g128))
      << "one z for all rows or the same z per row";
}

TEST(BkCoreOps, BadInputIsRefusedNamingWhatIsWrong) {
  const Inputs in = test::random_bk_core_inputs(2, 5, torch::kFloat64, 1, false);
  const auto err = [](const std::function<void()>& f) { return test::error_of(f); };
  EXPECT_NE(err([&] { detail::bk_core_ops(in.a.narrow(1, 0, 0), in.b, in.c, in.z); }).find("N >= 1"),
            std::string::npos);
  EXPECT_NE(err([&] { detail::bk_core_ops(in.a, in.b.narrow(1, 0, 3), in.c, in.z); }).find("b and c must be (B, N-1)"),
            std::string::npos);
  EXPECT_NE(err([&] {
              detail::bk_core_ops(in.a, in.b, in.c, torch::tensor(0.5, torch::kFloat64));
            }).find("z must be a complex scalar tensor or (B)"),
            std::string::npos);
  EXPECT_NE(err([&] {
              detail::bk_core_ops(in.a, in.b, in.c, torch::ones({3}, torch::kComplexDouble));
            }).find("z must be a complex scalar tensor or (B)"),
            std::string::npos);
  EXPECT_NE(err([&] { detail::bk_core_ops(in.a.to(torch::kInt64), in.b, in.c, in.z); }).find("float32 or float64"),
            std::string::npos);
  EXPECT_NE(err([&] { detail::bk_core_ops(in.a, in.b.to(torch::kFloat32), in.c, in.z); }).find("share one dtype"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
