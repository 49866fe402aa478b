// The skinny linear (Note [Skinny linear]) against LibTorch's linear on the GPU: every row count it
// takes, odd output counts, long and short rows, with and without a bias, fp32, fp16 and bf16,
// within one rounding of the output; and the shapes it leaves to cuBLAS.

#include "tandem/kernels/skinny_linear.h"

#include <gtest/gtest.h>

#include "../test_util.h"

namespace tandem {
namespace {

TEST(SkinnyLinear, CpuTensorsAndWideBatchesAreNotTaken) {
  EXPECT_FALSE(skinny_linear_takes(torch::zeros({1, 64}), torch::zeros({8, 64})));
  const auto message = test::error_of([] { skinny_linear(torch::zeros({1, 64}), torch::zeros({8, 64}), {}); });
  EXPECT_NE(message.find("the skinny linear takes"), std::string::npos) << message;
}

TEST(SkinnyLinearGpu, EqualsLinearWithinOneRounding) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(6);
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (const int64_t N : {1, 2, 3, 4})
      for (const auto& [O, K] : std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {77, 2048}, {3072, 5632}}) {
        const auto opts = torch::TensorOptions().dtype(dtype).device(cuda);
        const auto x = torch::randn({N, K}, opts), w = torch::randn({O, K}, opts) * 0.05;
        const auto b = torch::randn({O}, opts);
        ASSERT_TRUE(skinny_linear_takes(x, w));
        for (const bool with_bias : {false, true}) {
          const auto y = skinny_linear(x, w, with_bias ? b : torch::Tensor());
          // The reference in fp32 from the same inputs: both sum in fp32 and round once.
          auto ref = torch::nn::functional::linear(x.to(torch::kFloat32), w.to(torch::kFloat32),
                                                   with_bias ? b.to(torch::kFloat32) : torch::Tensor());
          const double tol = dtype == torch::kFloat32 ? 1e-4 : dtype == torch::kFloat16 ? 2e-3 : 1.6e-2;
          ASSERT_EQ(y.scalar_type(), dtype);
          EXPECT_TRUE(test::AllClose(y.to(torch::kFloat32).cpu(), ref.cpu(), tol, tol))
              << dtype << ", " << N << " rows, O " << O << ", K " << K << ", bias " << with_bias;
        }
      }
  const auto x = torch::randn({5, 64}, cuda), w = torch::randn({8, 64}, cuda);
  EXPECT_FALSE(skinny_linear_takes(x, w));                                             // five rows: cuBLAS's
  EXPECT_FALSE(skinny_linear_takes(x.narrow(0, 0, 1).narrow(1, 0, 60), w));            // K of 60
  EXPECT_FALSE(skinny_linear_takes(torch::randn({1, 66}, cuda).narrow(1, 2, 64), w));  // misaligned view
}

}  // namespace
}  // namespace tandem
