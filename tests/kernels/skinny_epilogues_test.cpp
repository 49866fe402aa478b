// The skinny products with an epilogue (Note [Skinny epilogues]) against the kernels they join, on
// the GPU: the skinny linear then silu_mul, and the skinny linear then rope_write_kv, bit for bit,
// in fp32, fp16 and bf16, for every row count, with and without a bias, RoPE over every dimension
// of a head and over half of them; the same products forming their own norm (Note [Norm in the
// product]) against add_rms_norm_cast before them; and what they refuse.

#include "tandem/kernels/skinny_epilogues.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "tandem/kernels/decode_fusions.h"
#include "tandem/kernels/skinny_linear.h"

namespace tandem {
namespace {

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const c10::Device kCuda(c10::kCUDA, 0);
const std::vector<torch::ScalarType> kDtypes{torch::kFloat32, torch::kBFloat16, torch::kFloat16};

TEST(SkinnyEpilogues, CpuTensorsAreRefusedWithWhatTheyTake) {
  const auto message = test::error_of([] { skinny_silu_mul(torch::zeros({1, 64}), torch::zeros({8, 64}), {}); });
  EXPECT_NE(message.find("skinny_silu_mul takes contiguous CUDA x"), std::string::npos) << message;
}

TEST(SkinnyEpiloguesGpu, SiluMulGivesTheSeparateKernelsBits) {
  REQUIRE_CUDA();
  torch::manual_seed(7);
  for (const auto dtype : kDtypes)
    for (const int64_t N : {1, 2, 3, 4})
      for (const auto& [F, K] : std::vector<std::pair<int64_t, int64_t>>{{5, 64}, {77, 2048}, {700, 5632}}) {
        const auto opts = torch::TensorOptions().dtype(dtype).device(kCuda);
        const auto x = torch::randn({N, K}, opts), w = torch::randn({2 * F, K}, opts) * 0.05;
        const auto b = torch::randn({2 * F}, opts);
        for (const bool with_bias : {false, true}) {
          const auto bias = with_bias ? b : torch::Tensor();
          const auto fused = skinny_silu_mul(x, w, bias);
          const auto separate = silu_mul(skinny_linear(x, w, bias));
          ASSERT_EQ(fused.sizes(), separate.sizes());
          EXPECT_TRUE(torch::equal(fused, separate))
              << dtype << ", " << N << " rows, F " << F << ", K " << K << ", bias " << with_bias;
        }
      }
}

TEST(SkinnyEpiloguesGpu, RopeAndCacheWritesGiveTheSeparateKernelsBits) {
  REQUIRE_CUDA();
  torch::manual_seed(8);
  const int64_t H = 8, KV = 2, hd = 64, P = 9, pt = 4, K = 512;
  using torch::indexing::Slice;
  for (const auto dtype : kDtypes)
    for (const int64_t N : {1, 2, 3, 4})
      for (const int64_t rotary : {hd, hd / 2})
        for (const bool with_bias : {false, true}) {
          const auto opts = torch::TensorOptions().dtype(dtype).device(kCuda);
          const auto x = torch::randn({N, K}, opts), w = torch::randn({(H + 2 * KV) * hd, K}, opts) * 0.05;
          const auto bias = with_bias ? torch::randn({(H + 2 * KV) * hd}, opts) : torch::Tensor();
          const auto cos = torch::randn({N, 1, rotary}, opts), sin = torch::randn({N, 1, rotary}, opts);
          const auto page = torch::tensor({3, 7, 0, 5}, torch::kInt64).narrow(0, 0, N).to(kCuda);
          const auto slot = torch::tensor({1, 2, 3, 0}, torch::kInt64).narrow(0, 0, N).to(kCuda);
          auto kc = torch::randn({P, KV, pt, hd}, opts), vc = torch::randn({P, KV, pt, hd}, opts);
          auto kc_ref = kc.clone(), vc_ref = vc.clone();
          const auto [q, k, v] = skinny_rope_kv(x, w, bias, H, KV, cos, sin, kc, vc, page, slot);

          const auto qkv = skinny_linear(x, w, bias);
          const auto [q_ref, k_ref] = rope_write_kv(qkv, H, KV, cos, sin, kc_ref, vc_ref, page, slot);
          const auto v_ref = qkv.narrow(1, (H + KV) * hd, KV * hd).view({N, KV, hd});
          const auto where = [&] { return c10::str(dtype, ", ", N, " rows, rotary ", rotary, ", bias ", with_bias); };
          EXPECT_TRUE(torch::equal(q, q_ref)) << where();
          EXPECT_TRUE(torch::equal(k, k_ref)) << where();
          EXPECT_TRUE(torch::equal(v, v_ref)) << where();
          EXPECT_TRUE(torch::equal(kc, kc_ref)) << where();
          EXPECT_TRUE(torch::equal(vc, vc_ref)) << where();
        }
}

// The norm inputs of the tests below: the stream, the added rows (or none) and a scale.
NormedInput norm_input(int64_t N, int64_t K, torch::ScalarType dtype, bool added, bool plus_one) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(kCuda);
  NormedInput in;
  in.stream = torch::randn({N, K}, f32) * 3.0;
  if (added) in.added = torch::randn({N, K}, f32.dtype(dtype));
  in.scale = torch::randn({K}, f32) * 0.2 + (plus_one ? 0.0 : 1.0);
  in.eps = 1e-5;
  in.plus_one = plus_one;
  return in;
}

TEST(SkinnyEpilogues, NormedProductsRefuseCpuTensorsWithWhatTheyTake) {
  NormedInput in;
  in.stream = torch::zeros({1, 64});
  in.scale = torch::ones({64});
  EXPECT_FALSE(skinny_norm_in_takes(in, torch::zeros({8, 64}), torch::kFloat32));
  const auto message = test::error_of([&] { skinny_silu_mul(in, torch::zeros({8, 64}), {}); });
  EXPECT_NE(message.find("skinny_silu_mul takes a CUDA fp32 stream"), std::string::npos) << message;
}

TEST(SkinnyEpiloguesGpu, SiluMulWithItsOwnNormGivesTheNormKernelsBits) {
  REQUIRE_CUDA();
  torch::manual_seed(9);
  for (const auto dtype : kDtypes)
    for (const int64_t N : {1, 2, 3, 4})
      for (const auto& [F, K] : std::vector<std::pair<int64_t, int64_t>>{{5, 64}, {77, 2048}, {300, 4096}})
        for (const bool added : {false, true})
          for (const bool plus_one : {false, true}) {
            const auto opts = torch::TensorOptions().dtype(dtype).device(kCuda);
            const auto in = norm_input(N, K, dtype, added, plus_one);
            const auto w = torch::randn({2 * F, K}, opts) * 0.05, bias = torch::randn({2 * F}, opts);
            const auto where = [&] {
              return c10::str(dtype, ", ", N, " rows, F ", F, ", K ", K, ", added ", added, ", plus one ", plus_one);
            };
            if (!skinny_norm_in_takes(in, w, dtype)) {  // rows past the shared memory
              EXPECT_GT(N * K * static_cast<int64_t>(c10::elementSize(dtype)), kSkinnyNormedBytes) << where();
              continue;
            }
            const auto [r, out] = skinny_silu_mul(in, w, bias);
            const auto [r_ref, h] = add_rms_norm_cast(in.stream, in.added, in.scale, in.eps, plus_one, dtype);
            const auto out_ref = skinny_silu_mul(h, w, bias);
            EXPECT_TRUE(torch::equal(r, r_ref)) << where();
            EXPECT_TRUE(torch::equal(out, out_ref)) << where();
          }
}

TEST(SkinnyEpiloguesGpu, RopeAndCacheWritesWithTheirOwnNormGiveTheNormKernelsBits) {
  REQUIRE_CUDA();
  torch::manual_seed(10);
  const int64_t H = 8, KV = 2, hd = 64, P = 9, pt = 4, K = 512;
  for (const auto dtype : kDtypes)
    for (const int64_t N : {1, 2, 3, 4})
      for (const int64_t rotary : {hd, hd / 2})
        for (const bool added : {false, true}) {
          const auto opts = torch::TensorOptions().dtype(dtype).device(kCuda);
          const auto in = norm_input(N, K, dtype, added, false);
          const auto w = torch::randn({(H + 2 * KV) * hd, K}, opts) * 0.05;
          const auto bias = torch::randn({(H + 2 * KV) * hd}, opts);
          const auto cos = torch::randn({N, 1, rotary}, opts), sin = torch::randn({N, 1, rotary}, opts);
          const auto page = torch::tensor({3, 7, 0, 5}, torch::kInt64).narrow(0, 0, N).to(kCuda);
          const auto slot = torch::tensor({1, 2, 3, 0}, torch::kInt64).narrow(0, 0, N).to(kCuda);
          auto kc = torch::randn({P, KV, pt, hd}, opts), vc = torch::randn({P, KV, pt, hd}, opts);
          auto kc_ref = kc.clone(), vc_ref = vc.clone();
          ASSERT_TRUE(skinny_norm_in_takes(in, w, dtype));
          const auto [r, q, k, v] = skinny_rope_kv(in, w, bias, H, KV, cos, sin, kc, vc, page, slot);

          const auto [r_ref, h] = add_rms_norm_cast(in.stream, in.added, in.scale, in.eps, false, dtype);
          const auto [q_ref, k_ref, v_ref] = skinny_rope_kv(h, w, bias, H, KV, cos, sin, kc_ref, vc_ref, page, slot);
          const auto where = [&] { return c10::str(dtype, ", ", N, " rows, rotary ", rotary, ", added ", added); };
          EXPECT_TRUE(torch::equal(r, r_ref)) << where();
          EXPECT_TRUE(torch::equal(q, q_ref)) << where();
          EXPECT_TRUE(torch::equal(k, k_ref)) << where();
          EXPECT_TRUE(torch::equal(v, v_ref)) << where();
          EXPECT_TRUE(torch::equal(kc, kc_ref)) << where();
          EXPECT_TRUE(torch::equal(vc, vc_ref)) << where();
        }
}

}  // namespace
}  // namespace tandem
