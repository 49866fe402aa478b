// The fused decode kernels (Note [Decode fusions]) against the LibTorch ops they replace in the
// decoder: the norm and its cast to rounding, the residual add exactly, RoPE and the cache writes bit
// for bit (partial rotary dimensions too), the gated activation to rounding; in fp32, fp16 and bf16.

#include "tandem/kernels/decode_fusions.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "tandem/models/decoder.h"
#include "tandem/models/norm.h"
#include "tandem/models/rope.h"

namespace tandem {
namespace {

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const c10::Device kCuda(c10::kCUDA, 0);

// One unit in the last place of values of order 1, and fp32's rounding.
double tolerance(torch::ScalarType t) { return t == torch::kBFloat16 ? 8e-3 : t == torch::kFloat16 ? 1e-3 : 2e-6; }

const std::vector<torch::ScalarType> kDtypes{torch::kFloat32, torch::kBFloat16, torch::kFloat16};

TEST(DecodeFusions, OnlyCudaTensorsTakeThem) {
  EXPECT_FALSE(decode_fusions_available(c10::Device(c10::kCPU), torch::kFloat32));
  const auto message = test::error_of([] { silu_mul(torch::zeros({2, 8})); });
  EXPECT_NE(message.find("CUDA tensors"), std::string::npos) << message;
}

TEST(DecodeFusionsGpu, NormsEqualNormFp32AndTheResidualAddIsExact) {
  REQUIRE_CUDA();
  torch::manual_seed(3);
  EXPECT_TRUE(fused_norm_takes(8192));
  EXPECT_FALSE(fused_norm_takes(8196));
  EXPECT_FALSE(fused_norm_takes(2050));
  for (const auto dtype : kDtypes)
    for (const bool plus_one : {false, true})
      for (const int64_t C : {int64_t{2048}, int64_t{1028}, int64_t{8192}}) {
        const auto kind = plus_one ? NormKind::kRmsPlusOne : NormKind::kRms;
        const auto x = torch::randn({5, C}, kCuda) * 3, w = torch::randn({C}, kCuda);
        const auto a = torch::randn({5, C}, kCuda).to(dtype);
        const auto alone = rms_norm_cast(x, w, 1e-5, plus_one, dtype);
        ASSERT_EQ(alone.scalar_type(), dtype);
        EXPECT_TRUE(test::AllClose(alone.cpu().to(torch::kFloat32),
                                   norm_fp32(x, w, {}, 1e-5, kind).to(dtype).cpu().to(torch::kFloat32),
                                   tolerance(dtype), tolerance(dtype)))
            << dtype << ", plus one " << plus_one << ", C " << C;
        const auto [r, h] = add_rms_norm_cast(x, a, w, 1e-5, plus_one, dtype);
        EXPECT_TRUE(torch::equal(r, x + a)) << dtype << ", C " << C;
        EXPECT_TRUE(test::AllClose(h.cpu().to(torch::kFloat32),
                                   norm_fp32(x + a, w, {}, 1e-5, kind).to(dtype).cpu().to(torch::kFloat32),
                                   tolerance(dtype), tolerance(dtype)))
            << dtype << ", plus one " << plus_one;
      }
}

TEST(DecodeFusionsGpu, RopeAndCacheWritesEqualApplyRopeAndIndexPutBitForBit) {
  REQUIRE_CUDA();
  torch::manual_seed(4);
  const int64_t N = 6, H = 8, KV = 2, hd = 64, P = 9, pt = 4;
  for (const auto dtype : kDtypes)
    for (const int64_t rotary : {hd, hd / 2}) {
      const auto opts = torch::TensorOptions().dtype(dtype).device(kCuda);
      const auto qkv = torch::randn({N, (H + 2 * KV) * hd}, opts);
      const auto cos = torch::randn({N, 1, rotary}, opts), sin = torch::randn({N, 1, rotary}, opts);
      const auto page = torch::tensor({3, 3, 7, 0, 5, 8}, torch::kInt64).to(kCuda);
      const auto slot = torch::tensor({0, 1, 2, 3, 0, 1}, torch::kInt64).to(kCuda);
      auto kc = torch::randn({P, KV, pt, hd}, opts), vc = torch::randn({P, KV, pt, hd}, opts);
      auto kc_ref = kc.clone(), vc_ref = vc.clone();
      const auto [q, k] = rope_write_kv(qkv, H, KV, cos, sin, kc, vc, page, slot);

      const auto qk = apply_rope(qkv.narrow(1, 0, (H + KV) * hd).view({N, H + KV, hd}), cos, sin);
      const auto v = qkv.narrow(1, (H + KV) * hd, KV * hd).view({N, KV, hd});
      using torch::indexing::Slice;
      kc_ref.index_put_({page, Slice(), slot}, qk.narrow(1, H, KV));
      vc_ref.index_put_({page, Slice(), slot}, v);
      EXPECT_TRUE(torch::equal(q, qk.narrow(1, 0, H))) << dtype << ", rotary " << rotary;
      EXPECT_TRUE(torch::equal(k, qk.narrow(1, H, KV))) << dtype << ", rotary " << rotary;
      EXPECT_TRUE(torch::equal(kc, kc_ref)) << dtype << ", rotary " << rotary;
      EXPECT_TRUE(torch::equal(vc, vc_ref)) << dtype << ", rotary " << rotary;
    }
}

TEST(DecodeFusionsGpu, SiluMulEqualsSiluTimesUp) {
  REQUIRE_CUDA();
  torch::manual_seed(5);
  for (const auto dtype : kDtypes) {
    const auto gu = (torch::randn({7, 2 * 1000}, kCuda) * 4).to(dtype);
    const auto out = silu_mul(gu);
    const auto ref = activate(gu.narrow(1, 0, 1000), Activation::kSilu) * gu.narrow(1, 1000, 1000);
    // Two units in the last place: the activation is rounded before the product, maybe differently.
    EXPECT_TRUE(test::AllClose(out.cpu().to(torch::kFloat32), ref.cpu().to(torch::kFloat32), 2 * tolerance(dtype),
                               2 * tolerance(dtype)))
        << dtype;
  }
}

}  // namespace
}  // namespace tandem
