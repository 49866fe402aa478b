// BK-core's CPU kernels and autograd Function beyond bk_core_test.cpp: the ratios satisfy their
// recurrences, N = 1 in closed form with gradients, dtypes, strided inputs, a shared z's gradient,
// the float backward against the double one, chunked rows against whole ones, and bad input.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <complex>
#include <functional>
#include <limits>
#include <string>

#include "../test_util.h"
#include "bk_core_inputs.h"
#include "tandem/kernels/bk_core.h"

namespace tandem {
namespace {

using test::error_of;

using Inputs = test::BkCoreInputs;

// Complex tensors compared as (re, im) pairs, element by element.
::testing::AssertionResult ComplexClose(const torch::Tensor& got, const torch::Tensor& want, double rtol, double atol) {
  return test::AllClose(torch::view_as_real(got.to(torch::kComplexDouble).contiguous()),
                        torch::view_as_real(want.to(torch::kComplexDouble).contiguous()), rtol, atol);
}

constexpr double kF64Eps = std::numeric_limits<double>::epsilon();

TEST(BkCoreCpu, TheRatiosSatisfyTheirRecurrencesAndGiveG) {
  const int64_t B = 3, N = 17;
  const auto in = test::random_bk_core_inputs(B, N, torch::kFloat64, 1, /*z_per_row=*/true);
  const auto [g, r, s] = detail::bk_core_forward_cpu(in.a, in.b, in.c, in.z);
  ASSERT_EQ(r.sizes(), (std::vector<int64_t>{B, N}));
  const auto d = in.a.to(torch::kComplexDouble) - in.z.unsqueeze(1);
  const auto p = (in.b * in.c).to(torch::kComplexDouble);
  const double tol = 16 * kF64Eps;
  // r_0 = d_0, r_i = d_i - p_{i-1} / r_{i-1}; s_{N-1} = d_{N-1}, s_i = d_i - p_i / s_{i+1}.
  EXPECT_TRUE(ComplexClose(r.select(1, 0), d.select(1, 0), 0, 0));
  EXPECT_TRUE(ComplexClose(s.select(1, N - 1), d.select(1, N - 1), 0, 0));
  EXPECT_TRUE(ComplexClose(r.narrow(1, 1, N - 1), d.narrow(1, 1, N - 1) - p / r.narrow(1, 0, N - 1), tol, tol));
  EXPECT_TRUE(ComplexClose(s.narrow(1, 0, N - 1), d.narrow(1, 0, N - 1) - p / s.narrow(1, 1, N - 1), tol, tol));
  EXPECT_TRUE(ComplexClose(g, 1.0 / (r + s - d), tol, tol));
  // The causal diagonal keeps s = d, so G = 1 / r.
  const auto [gc, rc, sc] = detail::bk_core_forward_cpu(in.a, in.b, in.c, in.z, BkCoreMode::kNative, true);
  EXPECT_TRUE(ComplexClose(sc, d, 0, 0));
  EXPECT_TRUE(ComplexClose(rc, r, 0, 0)) << "the forward ratios do not depend on the diagonal";
  EXPECT_TRUE(ComplexClose(gc, 1.0 / rc, tol, tol));
}

// N = 1: G = 1 / (a - z). With L = Re(G conj(W)): dL/da = Re(-G^2 conj(W)), and z's gradient in
// PyTorch's convention (dL/dRe z + i dL/dIm z) is conj(G^2) W.
TEST(BkCoreCpu, ASingleElementIsTheReciprocalOfAMinusZWithItsGradients) {
  for (const auto diagonal : {BkCoreDiagonal::kFull, BkCoreDiagonal::kCausal}) {
    const auto in = test::random_bk_core_inputs(4, 1, torch::kFloat64, 2, /*z_per_row=*/true);
    auto a = in.a.clone().requires_grad_(true), b = in.b.clone().requires_grad_(true);
    auto c = in.c.clone().requires_grad_(true), z = in.z.clone().requires_grad_(true);
    const auto g = bk_core(a, b, c, z, BkCoreMode::kNative, diagonal);
    const auto want = 1.0 / (in.a.to(torch::kComplexDouble) - in.z.unsqueeze(1));
    EXPECT_TRUE(ComplexClose(g, want, 4 * kF64Eps, 0));
    const auto W = torch::randn({4, 1}, torch::kComplexDouble);
    torch::real(g * W.conj()).sum().backward();
    const auto G2 = want * want;
    EXPECT_TRUE(test::AllClose(a.grad(), torch::real(-G2 * W.conj()), 16 * kF64Eps, 16 * kF64Eps));
    EXPECT_TRUE(ComplexClose(z.grad(), (G2.conj() * W).squeeze(1), 16 * kF64Eps, 16 * kF64Eps));
    EXPECT_EQ(b.grad().sizes(), (std::vector<int64_t>{4, 0}));
    EXPECT_EQ(c.grad().sizes(), (std::vector<int64_t>{4, 0}));
  }
}

TEST(BkCoreCpu, OutputsAndGradientsHaveTheInputsDtypes) {
  for (const auto t : {torch::kFloat32, torch::kFloat64}) {
    const auto in = test::random_bk_core_inputs(2, 9, t, 3, /*z_per_row=*/false);
    auto a = in.a.clone().requires_grad_(true), b = in.b.clone().requires_grad_(true);
    auto c = in.c.clone().requires_grad_(true);
    auto z = in.z.to(torch::kComplexFloat).requires_grad_(true);  // a complex64 shift for either
    const auto g = bk_core(a, b, c, z);
    EXPECT_EQ(g.scalar_type(), detail::bk_core_complex_type(t));
    torch::real(g).sum().backward();
    EXPECT_EQ(a.grad().scalar_type(), t);
    EXPECT_EQ(b.grad().scalar_type(), t);
    EXPECT_EQ(c.grad().scalar_type(), t);
    EXPECT_EQ(z.grad().scalar_type(), torch::kComplexFloat) << "z's gradient is in z's dtype";
    EXPECT_EQ(z.grad().dim(), 0) << "a shared z has a 0-d gradient";
  }
  EXPECT_EQ(detail::bk_core_complex_type(torch::kFloat32), torch::kComplexFloat);
  EXPECT_EQ(detail::bk_core_complex_type(torch::kFloat64), torch::kComplexDouble);
}

TEST(BkCoreCpu, StridedInputsGiveTheContiguousResult) {
  const auto in = test::random_bk_core_inputs(5, 33, torch::kFloat64, 4, /*z_per_row=*/true);
  // The same values laid out (N, B) and transposed back: strided (B, N) views.
  const auto a_t = in.a.t().contiguous().t(), b_t = in.b.t().contiguous().t(), c_t = in.c.t().contiguous().t();
  ASSERT_FALSE(a_t.is_contiguous());
  const auto want = bk_core(in.a, in.b, in.c, in.z);
  EXPECT_TRUE(ComplexClose(bk_core(a_t, b_t, c_t, in.z), want, 0, 0));
  // Gradients too.
  const auto W = torch::randn({5, 33}, torch::kComplexDouble);
  std::vector<torch::Tensor> grads[2];
  for (int k = 0; k < 2; ++k) {
    auto a = (k == 0 ? in.a : a_t).detach().requires_grad_(true);
    auto b = (k == 0 ? in.b : b_t).detach().requires_grad_(true);
    auto c = (k == 0 ? in.c : c_t).detach().requires_grad_(true);
    torch::real(bk_core(a, b, c, in.z) * W.conj()).sum().backward();
    grads[k] = {a.grad(), b.grad(), c.grad()};
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(test::AllClose(grads[1][i], grads[0][i], 0, 0)) << "gradient " << i;
}

TEST(BkCoreCpu, ASharedZsGradientIsTheSumOfThePerRowOnes) {
  const auto in = test::random_bk_core_inputs(4, 20, torch::kFloat64, 5, /*z_per_row=*/false);
  const auto W = torch::randn({4, 20}, torch::kComplexDouble);
  auto shared = in.z.clone().requires_grad_(true);
  auto per_row = in.z.expand({4}).clone().requires_grad_(true);
  const auto g_shared = bk_core(in.a, in.b, in.c, shared);
  const auto g_rows = bk_core(in.a, in.b, in.c, per_row);
  EXPECT_TRUE(ComplexClose(g_shared, g_rows, 0, 0));
  torch::real(g_shared * W.conj()).sum().backward();
  torch::real(g_rows * W.conj()).sum().backward();
  EXPECT_TRUE(ComplexClose(shared.grad(), per_row.grad().sum(), 8 * kF64Eps, 8 * kF64Eps));
  EXPECT_FALSE(ComplexClose(per_row.grad()[0], per_row.grad()[1], 1e-6, 0)) << "the rows' gradients are alike";
}

// The adjoint sweeps in float track the double ones to float's precision on a row of 2000.
TEST(BkCoreCpu, TheFloatBackwardTracksTheDoubleBackward) {
  const auto in = test::random_bk_core_inputs(3, 2000, torch::kFloat64, 6, /*z_per_row=*/true);
  const auto W = torch::randn({3, 2000}, torch::kComplexDouble);
  std::vector<torch::Tensor> grads[2];  // a, b, c, z in double; in float
  for (int k = 0; k < 2; ++k) {
    const auto t = k == 0 ? torch::kFloat64 : torch::kFloat32;
    const auto leaf = [&](const torch::Tensor& x) { return x.detach().to(t).clone().requires_grad_(true); };
    auto a = leaf(in.a), b = leaf(in.b), c = leaf(in.c);
    auto z = in.z.detach().clone().requires_grad_(true);
    const auto g = bk_core(a, b, c, z);
    torch::real(g * W.to(g.scalar_type()).conj()).sum().backward();
    grads[k] = {a.grad().to(torch::kFloat64), b.grad().to(torch::kFloat64), c.grad().to(torch::kFloat64),
                torch::view_as_real(z.grad())};
  }
  // Errors relative to each tensor's largest gradient: float's epsilon grown by the sweeps' length.
  const char* names[] = {"a", "b", "c", "z"};
  for (int i = 0; i < 4; ++i) {
    const double scale = grads[0][i].abs().max().item<double>();
    EXPECT_TRUE(test::AllClose(grads[1][i], grads[0][i], 0, 1e-4 * scale)) << names[i];
  }
}

// Few long rows are swept in chunks over the threads (Note [Chunked ratio sweep]); as many rows as
// threads are swept whole. The same row either way agrees to double's rounding.
TEST(BkCoreCpu, AChunkedRowEqualsTheSameRowSweptWhole) {
  struct Threads {
    int saved = at::get_num_threads();
    ~Threads() { at::set_num_threads(saved); }
  } restore;
  at::set_num_threads(4);
  const int64_t N = 1 << 14;  // the shortest row that is chunked
  for (const auto diagonal : {BkCoreDiagonal::kFull, BkCoreDiagonal::kCausal}) {
    const auto in = test::random_bk_core_inputs(4, N, torch::kFloat64, 7, /*z_per_row=*/true);
    const auto whole = bk_core(in.a, in.b, in.c, in.z, BkCoreMode::kNative, diagonal);  // B = threads: unchunked
    const auto one = [](const torch::Tensor& t) { return t.narrow(0, 2, 1); };
    const auto chunked = bk_core(one(in.a), one(in.b), one(in.c), one(in.z), BkCoreMode::kNative, diagonal);
    // Each is within 1e-10 of the long-double reference (bk_core_test.cpp); |G| <= 2.
    EXPECT_TRUE(ComplexClose(chunked[0], whole[2], 2e-10, 2e-10))
        << (diagonal == BkCoreDiagonal::kCausal ? "causal" : "full");
  }
}

TEST(BkCoreCpu, BadInputIsRefusedWithWhatIsWrong) {
  const auto in = test::random_bk_core_inputs(2, 8, torch::kFloat64, 8, /*z_per_row=*/true);
  const auto refused = [](const std::function<void()>& f, const std::string& part) {
    const std::string msg = error_of(f);
    return msg.find(part) != std::string::npos
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << "'" << msg << "' lacks '" << part << "'";
  };
  EXPECT_TRUE(refused([&] { bk_core(in.a.flatten(), in.b, in.c, in.z); }, "a must be (B, N) with N >= 1"));
  EXPECT_TRUE(refused(
      [&] {
        bk_core(torch::zeros({2, 0}, torch::kFloat64), torch::zeros({2, 0}, torch::kFloat64),
                torch::zeros({2, 0}, torch::kFloat64), in.z);
      },
      "a must be (B, N) with N >= 1"));
  EXPECT_TRUE(refused([&] { bk_core(in.a, in.b, in.c.narrow(0, 0, 1), in.z); }, "b and c must be (B, N-1)"));
  EXPECT_TRUE(refused([&] { bk_core(in.a.to(torch::kHalf), in.b.to(torch::kHalf), in.c.to(torch::kHalf), in.z); },
                      "must be float32 or float64"));
  EXPECT_TRUE(refused([&] { bk_core(in.a, in.b.to(torch::kFloat32), in.c, in.z); }, "must share one dtype"));
  EXPECT_TRUE(refused([&] { bk_core(in.a, in.b, in.c, torch::real(in.z)); }, "z must be a complex scalar tensor"));
  EXPECT_TRUE(refused([&] { bk_core(in.a, in.b, in.c, in.z.unsqueeze(0)); }, "z must be a complex scalar tensor"));
  EXPECT_TRUE(
      refused([&] { detail::bk_core_forward_cpu(in.a, in.b, in.c, in.z, BkCoreMode::kMixed); }, "mixed mode takes"));
}

// A z given as a conjugate view (torch's lazy conj bit) is read as its value, not as the memory
// under the view.
TEST(BkCoreCpu, AConjugateViewOfZIsReadAsItsValue) {
  torch::manual_seed(3);
  const auto a = torch::rand({2, 9}, torch::kFloat64), b = torch::rand({2, 8}, torch::kFloat64),
             c = torch::rand({2, 8}, torch::kFloat64);
  const auto z = torch::complex(torch::rand({2}, torch::kFloat64), 0.5 + torch::rand({2}, torch::kFloat64));
  const auto view = z.conj();
  ASSERT_TRUE(view.is_conj());
  EXPECT_TRUE(torch::allclose(bk_core(a, b, c, view), bk_core(a, b, c, view.resolve_conj()), 1e-12, 1e-12));
}

}  // namespace
}  // namespace tandem
