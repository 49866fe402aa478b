// BK-core on the CPU: the ratio form against a dense inverse, the complex128 and complex64 sweeps
// against the long-double reference as N grows to 10^6, and the analytic backward against central
// finite differences in double.

#include "tandem/kernels/bk_core.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "bk_core_inputs.h"

namespace tandem {
namespace {

// Well conditioned (tests/kernels/bk_core_inputs.h): a real spectrum at distance >= 0.5 from z.
test::BkCoreInputs random_inputs(int64_t B, int64_t N, torch::ScalarType t, uint64_t seed, bool z_per_row = false) {
  return test::random_bk_core_inputs(B, N, t, seed, z_per_row);
}

double max_rel_error(const torch::Tensor& got, const torch::Tensor& ref) {
  const auto g = got.to(torch::kComplexDouble);
  return ((g - ref).abs() / ref.abs()).max().item<double>();
}

TEST(BkCore, RatioFormEqualsTheDiagonalOfTheDenseInverse) {
  for (int64_t N : {1, 2, 3, 9}) {
    const auto in = random_inputs(2, N, torch::kFloat64, 1 + N, /*z_per_row=*/true);
    const auto g = bk_core(in.a, in.b, in.c, in.z);
    for (int64_t row = 0; row < 2; ++row) {
      auto H = torch::diag(in.a[row]).to(torch::kComplexDouble);
      if (N > 1) H = H + torch::diag(in.b[row], 1) + torch::diag(in.c[row], -1);
      const auto inv = torch::linalg_inv(H - in.z[row] * torch::eye(N, torch::kComplexDouble));
      EXPECT_LT(max_rel_error(g[row], torch::diagonal(inv)), 1e-12) << "N=" << N << " row " << row;
    }
  }
}

TEST(BkCore, CausalDiagonalIsTheLastEntryOfEachLeadingBlocksResolvent) {
  const int64_t N = 9;
  const auto in = random_inputs(2, N, torch::kFloat64, 12, /*z_per_row=*/true);
  const auto g = bk_core(in.a, in.b, in.c, in.z, BkCoreMode::kNative, BkCoreDiagonal::kCausal);
  for (int64_t row = 0; row < 2; ++row) {
    auto H = torch::diag(in.a[row]).to(torch::kComplexDouble) + torch::diag(in.b[row], 1) + torch::diag(in.c[row], -1);
    for (int64_t i = 0; i < N; ++i) {
      const auto lead = H.slice(0, 0, i + 1).slice(1, 0, i + 1) - in.z[row] * torch::eye(i + 1, torch::kComplexDouble);
      const auto want = torch::linalg_inv(lead)[i][i];
      EXPECT_LT(std::abs((g[row][i] - want).abs().item<double>() / want.abs().item<double>()), 1e-12)
          << row << " " << i;
    }
  }
  // A change at position j moves no causal entry before j.
  auto a2 = in.a.clone();
  a2[0][6] += 0.5;
  const auto g2 = bk_core(a2, in.b, in.c, in.z, BkCoreMode::kNative, BkCoreDiagonal::kCausal);
  EXPECT_TRUE(torch::equal(g2[0].slice(0, 0, 6), g[0].slice(0, 0, 6)));
  EXPECT_FALSE(torch::equal(g2[0][6], g[0][6]));
}

TEST(BkCore, Complex128AndComplex64StayAccurateUpToAMillion) {
  for (int64_t N : {100, 1000, 10000, 100000, 1000000}) {
    const auto in = random_inputs(1, N, torch::kFloat64, 7);
    const auto ref = detail::bk_core_reference(in.a, in.b, in.c, in.z);
    const double e128 = max_rel_error(bk_core(in.a, in.b, in.c, in.z), ref);
    const double e64 =
        max_rel_error(bk_core(in.a.to(torch::kFloat32), in.b.to(torch::kFloat32), in.c.to(torch::kFloat32), in.z), ref);
    std::printf("bk_core N=%-8lld max relative error: complex128 %.2e, complex64 %.2e\n", static_cast<long long>(N),
                e128, e64);
    EXPECT_LT(e128, 1e-10) << "N=" << N;
    EXPECT_LT(e64, 1e-4) << "N=" << N;
  }
}

// Few long rows run chunked over several threads (Note [Chunked ratio sweep]); the result must stay
// within the same bounds against the reference as the plain sweep, for both diagonals.
TEST(BkCore, ChunkedSweepsOfLongRowsStayAccurate) {
  const int saved = at::get_num_threads();
  at::set_num_threads(4);
  for (const auto diagonal : {BkCoreDiagonal::kFull, BkCoreDiagonal::kCausal}) {
    const auto in = random_inputs(2, 200003, torch::kFloat64, 13, /*z_per_row=*/true);
    const auto ref = diagonal == BkCoreDiagonal::kFull
                         ? detail::bk_core_reference(in.a, in.b, in.c, in.z)
                         : detail::bk_core_ops(in.a.slice(1, 0, 3000), in.b.slice(1, 0, 2999), in.c.slice(1, 0, 2999),
                                               in.z, /*causal=*/true);
    const auto g = bk_core(in.a, in.b, in.c, in.z, BkCoreMode::kNative, diagonal);
    const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat32); };
    const auto g64 = bk_core(f(in.a), f(in.b), f(in.c), in.z, BkCoreMode::kNative, diagonal);
    const int64_t n = ref.size(1);
    EXPECT_LT(max_rel_error(g.slice(1, 0, n), ref), 1e-10);
    EXPECT_LT(max_rel_error(g64.slice(1, 0, n), ref), 1e-4);
  }
  at::set_num_threads(saved);
}

TEST(BkCore, BatchRowsAndPerRowShiftsAreIndependent) {
  const auto in = random_inputs(5, 300, torch::kFloat64, 3, /*z_per_row=*/true);
  const auto all = bk_core(in.a, in.b, in.c, in.z);
  for (int64_t row = 0; row < 5; ++row) {
    const auto one = bk_core(in.a.slice(0, row, row + 1), in.b.slice(0, row, row + 1), in.c.slice(0, row, row + 1),
                             in.z.slice(0, row, row + 1));
    EXPECT_TRUE(torch::equal(all[row], one[0])) << row;
  }
}

// L = sum Re(G conj(W)): autograd's gradients against central differences, in double.
TEST(BkCore, BackwardMatchesFiniteDifferences) {
  for (int variant = 0; variant < 3; ++variant) {
    const bool z_per_row = variant >= 1;
    const BkCoreDiagonal diagonal = variant == 2 ? BkCoreDiagonal::kCausal : BkCoreDiagonal::kFull;
    const int64_t B = 2, N = 40;
    auto in = random_inputs(B, N, torch::kFloat64, 11, z_per_row);
    in.a.requires_grad_(true), in.b.requires_grad_(true), in.c.requires_grad_(true), in.z.requires_grad_(true);
    const auto W = torch::randn({B, N}, torch::kComplexDouble);
    auto loss_of = [&](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& z) {
      return torch::real(bk_core(a, b, c, z, BkCoreMode::kNative, diagonal) * W.conj()).sum();
    };
    loss_of(in.a, in.b, in.c, in.z).backward();
    torch::NoGradGuard no_grad;
    const double h = 1e-6;
    auto fd = [&](torch::Tensor x, int64_t flat, torch::Tensor perturb_dir) {
      auto xp = x.detach().clone(), xm = x.detach().clone();
      xp.view(-1)[flat] += perturb_dir;
      xm.view(-1)[flat] -= perturb_dir;
      return std::make_pair(xp, xm);
    };
    for (int k = 0; k < 12; ++k) {
      const int64_t ia = (k * 7) % (B * N), ib = (k * 5) % (B * (N - 1));
      {
        auto [p, m] = fd(in.a, ia, torch::tensor(h, torch::kFloat64));
        const double num = (loss_of(p, in.b, in.c, in.z) - loss_of(m, in.b, in.c, in.z)).item<double>() / (2 * h);
        EXPECT_NEAR(in.a.grad().view(-1)[ia].item<double>(), num, 1e-7 * (1 + std::abs(num))) << "a " << ia;
      }
      {
        auto [p, m] = fd(in.b, ib, torch::tensor(h, torch::kFloat64));
        const double num = (loss_of(in.a, p, in.c, in.z) - loss_of(in.a, m, in.c, in.z)).item<double>() / (2 * h);
        EXPECT_NEAR(in.b.grad().view(-1)[ib].item<double>(), num, 1e-7 * (1 + std::abs(num))) << "b " << ib;
      }
      {
        auto [p, m] = fd(in.c, ib, torch::tensor(h, torch::kFloat64));
        const double num = (loss_of(in.a, in.b, p, in.z) - loss_of(in.a, in.b, m, in.z)).item<double>() / (2 * h);
        EXPECT_NEAR(in.c.grad().view(-1)[ib].item<double>(), num, 1e-7 * (1 + std::abs(num))) << "c " << ib;
      }
    }
    // z: PyTorch's complex gradient is dL/dRe(z) + i dL/dIm(z).
    const int64_t iz = z_per_row ? 1 : 0;
    for (auto [dir, part] :
         {std::make_pair(c10::complex<double>(h, 0), 0), std::make_pair(c10::complex<double>(0, h), 1)}) {
      auto zp = in.z.detach().clone(), zm = in.z.detach().clone();
      zp.view(-1)[iz] += torch::scalar_tensor(dir, torch::kComplexDouble);
      zm.view(-1)[iz] -= torch::scalar_tensor(dir, torch::kComplexDouble);
      const double num = (loss_of(in.a, in.b, in.c, zp) - loss_of(in.a, in.b, in.c, zm)).item<double>() / (2 * h);
      const auto gz = in.z.grad().view(-1)[iz];
      const double got = part == 0 ? torch::real(gz).item<double>() : torch::imag(gz).item<double>();
      EXPECT_NEAR(got, num, 1e-7 * (1 + std::abs(num))) << "z part " << part << " per-row " << z_per_row;
    }
  }
}

TEST(BkCore, MixedModeOnTheCpuStaysWithinTheComplex64Bound) {
  const auto in = random_inputs(2, 100000, torch::kFloat64, 5);
  const auto ref = detail::bk_core_reference(in.a, in.b, in.c, in.z);
  const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat32); };
  const auto mixed = bk_core(f(in.a), f(in.b), f(in.c), in.z, BkCoreMode::kMixed);
  EXPECT_EQ(mixed.scalar_type(), torch::kComplexFloat);
  EXPECT_LT(max_rel_error(mixed, ref), 1e-4);
  EXPECT_NE(
      test::error_of([&] { bk_core(in.a, in.b, in.c, in.z, BkCoreMode::kMixed); }).find("mixed mode takes float32"),
      std::string::npos);
}

// The CUDA kernels against the long-double reference and against the CPU backward.
TEST(BkCore, CudaKernelsMatchTheReferenceAndTheCpuBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  for (int64_t N : {1, 17, 4096, 1000000}) {
    const int64_t B = N == 1000000 ? 2 : 33;
    const auto in = random_inputs(B, N, torch::kFloat64, 21 + N, /*z_per_row=*/true);
    const auto ref = detail::bk_core_reference(in.a, in.b, in.c, in.z);
    const auto g128 = bk_core(in.a.to(cuda), in.b.to(cuda), in.c.to(cuda), in.z.to(cuda));
    ASSERT_TRUE(g128.is_cuda());
    const auto f = [&](const torch::Tensor& t) { return t.to(cuda, torch::kFloat32); };
    const auto g64 = bk_core(f(in.a), f(in.b), f(in.c), in.z.to(cuda));
    const auto gmix = bk_core(f(in.a), f(in.b), f(in.c), in.z.to(cuda), BkCoreMode::kMixed);
    const double e128 = max_rel_error(g128.cpu(), ref), e64 = max_rel_error(g64.cpu(), ref),
                 emix = max_rel_error(gmix.cpu(), ref);
    std::printf("bk_core CUDA N=%-8lld max relative error: complex128 %.2e, complex64 %.2e, mixed %.2e\n",
                static_cast<long long>(N), e128, e64, emix);
    EXPECT_LT(e128, 1e-10) << N;
    EXPECT_LT(e64, 1e-4) << N;
    EXPECT_LT(emix, 1e-4) << N;
  }
  // The scan kernels cut rows into tiles of 512 and chunks of 16: lengths on and around those cuts,
  // both diagonals, a shared and a per-row z. Forward values and gradients equal the CPU sweeps.
  for (const int64_t N : {2, 17, 255, 511, 512, 513, 5000})
    for (const BkCoreDiagonal diagonal : {BkCoreDiagonal::kFull, BkCoreDiagonal::kCausal}) {
      const bool per_row = N % 2 == 1;
      auto in = random_inputs(3, N, torch::kFloat64, 4 + N, per_row);
      const auto W = torch::randn({3, N}, torch::kComplexDouble);
      std::vector<torch::Tensor> cpu_grads, gpu_grads, values;
      for (const bool on_gpu : {false, true}) {
        auto a = in.a.detach().to(on_gpu ? cuda : torch::kCPU).requires_grad_(true);
        auto b = in.b.detach().to(on_gpu ? cuda : torch::kCPU).requires_grad_(true);
        auto c = in.c.detach().to(on_gpu ? cuda : torch::kCPU).requires_grad_(true);
        auto z = in.z.detach().to(on_gpu ? cuda : torch::kCPU).requires_grad_(true);
        const auto g = bk_core(a, b, c, z, BkCoreMode::kNative, diagonal);
        values.push_back(g.detach().cpu());
        torch::real(g * W.to(a.device()).conj()).sum().backward();
        auto& out = on_gpu ? gpu_grads : cpu_grads;
        for (auto* t : {&a, &b, &c}) out.push_back(t->grad().cpu());
        out.push_back(torch::view_as_real(z.grad().cpu()));
      }
      const bool causal = diagonal == BkCoreDiagonal::kCausal;
      EXPECT_TRUE(test::AllClose(values[1], values[0], 1e-11, 1e-13)) << "N " << N << " causal " << causal;
      {  // without autograd the forward keeps no ratios: the same values
        torch::NoGradGuard ng;
        const auto g =
            bk_core(in.a.to(cuda), in.b.to(cuda), in.c.to(cuda), in.z.to(cuda), BkCoreMode::kNative, diagonal);
        EXPECT_TRUE(test::AllClose(g.cpu(), values[0], 1e-11, 1e-13)) << "N " << N << " causal " << causal;
      }
      for (size_t i = 0; i < cpu_grads.size(); ++i)
        EXPECT_TRUE(test::AllClose(gpu_grads[i], cpu_grads[i], 1e-9, 1e-12))
            << "gradient " << i << " N " << N << " causal " << causal;
    }
  // Float gradients on a long row stay close to the double ones (the adjoint scans in float).
  {
    auto in = random_inputs(2, 70000, torch::kFloat64, 9, true);
    const auto W = torch::randn({2, 70000}, torch::kComplexDouble);
    std::vector<torch::Tensor> grads;
    for (const auto t : {torch::kFloat64, torch::kFloat32}) {
      auto a = in.a.detach().to(cuda, t).requires_grad_(true);
      auto b = in.b.detach().to(cuda, t).requires_grad_(true);
      auto c = in.c.detach().to(cuda, t).requires_grad_(true);
      torch::real(bk_core(a, b, c, in.z.to(cuda)) * W.to(cuda, detail::bk_core_complex_type(t)).conj())
          .sum()
          .backward();
      grads.push_back(torch::cat({a.grad(), b.grad(), c.grad()}, 1).cpu().to(torch::kFloat64));
    }
    const double rel = ((grads[1] - grads[0]).abs().max() / grads[0].abs().max()).item<double>();
    std::printf("bk_core CUDA float backward, N=70000: max error %.2e of the largest gradient\n", rel);
    EXPECT_LT(rel, 1e-4);
  }
}

// The LibTorch-ops version, differentiated by autograd, agrees with the kernels and their
// analytic backward: an independent check of both.
TEST(BkCore, TensorOpsFallbackAgreesInValueAndGradient) {
  for (const bool causal : {false, true}) {
    const auto in = random_inputs(3, 50, torch::kFloat64, 8, /*z_per_row=*/true);
    const auto W = torch::randn({3, 50}, torch::kComplexDouble);
    std::vector<torch::Tensor> grads[2];
    torch::Tensor values[2];
    for (int k = 0; k < 2; ++k) {
      auto a = in.a.detach().clone().requires_grad_(true), b = in.b.detach().clone().requires_grad_(true);
      auto c = in.c.detach().clone().requires_grad_(true), z = in.z.detach().clone().requires_grad_(true);
      values[k] =
          k == 0 ? detail::bk_core_ops(a, b, c, z, causal)
                 : bk_core(a, b, c, z, BkCoreMode::kNative, causal ? BkCoreDiagonal::kCausal : BkCoreDiagonal::kFull);
      torch::real(values[k] * W.conj()).sum().backward();
      grads[k] = {a.grad(), b.grad(), c.grad(), torch::view_as_real(z.grad())};
    }
    EXPECT_TRUE(
        test::AllClose(torch::view_as_real(values[1].detach()), torch::view_as_real(values[0].detach()), 1e-12, 1e-14));
    for (size_t i = 0; i < 4; ++i)
      EXPECT_TRUE(test::AllClose(grads[1][i], grads[0][i], 1e-10, 1e-12)) << "gradient " << i << " causal " << causal;
  }
}

TEST(BkCore, BadShapesAreRefused) {
  const auto in = random_inputs(2, 8, torch::kFloat64, 1);
  EXPECT_NE(test::error_of([&] { bk_core(in.a, in.b.slice(1, 0, 6), in.c, in.z); }).find("b and c must be (B, N-1)"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              bk_core(in.a, in.b, in.c, torch::ones({3}, torch::kComplexDouble));
            }).find("z must be a complex scalar tensor or (B)"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
