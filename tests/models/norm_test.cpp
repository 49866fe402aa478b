// The decoder families' norms (models/norm.h): RMSNorm, RMSNorm with a (1 + w) scale and LayerNorm
// against a plain double-precision reference, their initial parameters, a low-precision scale
// meeting an fp32 input, and norm_fp32 whatever the dtypes.

#include "tandem/models/norm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "../test_util.h"

namespace tandem {
namespace {

// The norm over the last dimension in double, from the inputs' values.
torch::Tensor reference_norm(const torch::Tensor& x_in, const torch::Tensor& w_in, const torch::Tensor& b_in,
                             double eps, NormKind kind) {
  const auto x = x_in.to(torch::kFloat64), w = w_in.to(torch::kFloat64);
  if (kind == NormKind::kLayerNorm) {
    const auto mean = x.mean(-1, true);
    const auto var = (x - mean).pow(2).mean(-1, true);  // biased, as LayerNorm's
    return (x - mean) / torch::sqrt(var + eps) * w + b_in.to(torch::kFloat64);
  }
  const auto rms = torch::sqrt(x.pow(2).mean(-1, true) + eps);
  return x / rms * (kind == NormKind::kRmsPlusOne ? 1 + w : w);
}

const char* name(NormKind k) {
  return k == NormKind::kRms ? "rms" : k == NormKind::kRmsPlusOne ? "rms+1" : "layernorm";
}

constexpr NormKind kKinds[] = {NormKind::kRms, NormKind::kRmsPlusOne, NormKind::kLayerNorm};
constexpr double kF32Tol = 16 * std::numeric_limits<float>::epsilon();
constexpr double kBf16Tol = 4.0 / 128;

TEST(Norm, StartsAsTheIdentityScaleWithABiasForLayerNormOnly) {
  for (const NormKind kind : kKinds) {
    Norm n(7, 1e-5, kind);
    size_t params = 0;
    for (const auto& item : n->named_parameters()) {
      ++params;
      EXPECT_TRUE(item.key() == "weight" || item.key() == "bias") << item.key();
    }
    EXPECT_EQ(params, kind == NormKind::kLayerNorm ? 2u : 1u) << name(kind);
    EXPECT_TRUE(torch::equal(n->weight, kind == NormKind::kRmsPlusOne ? torch::zeros({7}) : torch::ones({7})))
        << name(kind) << ": the scale does not start at 1";
    EXPECT_EQ(n->bias.defined(), kind == NormKind::kLayerNorm) << name(kind);
    if (n->bias.defined()) {
      EXPECT_TRUE(n->bias.eq(0).all().item<bool>());
    }
  }
}

TEST(Norm, EachKindMatchesTheReference) {
  for (const NormKind kind : kKinds)
    for (const int64_t dim : {1, 7, 17})
      for (const double eps : {1e-6, 0.5}) {  // 0.5: where eps enters shows
        torch::manual_seed(dim);
        Norm n(dim, eps, kind);
        {
          torch::NoGradGuard g;
          n->weight.copy_(torch::randn({dim}));
          if (n->bias.defined()) n->bias.copy_(torch::randn({dim}));
        }
        auto x = torch::randn({2, 5, dim}) * 0.7;
        x[1][3].zero_();  // a zero row: only eps keeps it finite
        const auto got = n->forward(x);
        EXPECT_EQ(got.scalar_type(), torch::kFloat32);
        EXPECT_TRUE(test::AllClose(got, reference_norm(x, n->weight, n->bias, eps, kind), kF32Tol, kF32Tol))
            << name(kind) << " dim " << dim << " eps " << eps;
      }
}

TEST(Norm, RowsAreNormalisedIndependently) {
  torch::manual_seed(3);
  Norm n(17, 1e-5, NormKind::kLayerNorm);
  auto x = torch::randn({4, 17});
  const auto all = n->forward(x);
  auto scaled = x.clone();
  scaled[2] *= 1000;  // LayerNorm ignores a row's scale (up to eps); the others must not move at all
  const auto again = n->forward(scaled);
  for (int64_t r : {0, 1, 3}) EXPECT_TRUE(torch::equal(again[r], all[r])) << r;
  EXPECT_TRUE(test::AllClose(again[2], all[2], 1e-4, 1e-4));
}

TEST(Norm, ALowPrecisionInputComputesInItsDtype) {
  for (const NormKind kind : kKinds) {
    torch::manual_seed(4);
    Norm n(17, 1e-5, kind);
    {
      torch::NoGradGuard g;
      n->weight.copy_(torch::randn({17}));
      if (n->bias.defined()) n->bias.copy_(torch::randn({17}));
    }
    const auto x = torch::randn({3, 17}).to(torch::kBFloat16);
    const auto got = n->forward(x);
    EXPECT_EQ(got.scalar_type(), torch::kBFloat16) << name(kind);
    // The scale meets x as bf16.
    const auto w16 = n->weight.detach().to(torch::kBFloat16);
    const auto b16 = n->bias.defined() ? n->bias.detach().to(torch::kBFloat16) : torch::Tensor();
    EXPECT_TRUE(test::AllClose(got, reference_norm(x, w16, b16, 1e-5, kind), kBf16Tol, kBf16Tol)) << name(kind);
  }
}

// Gemma's (1 + w) norm on a bf16 stream computes in fp32 and rounds once, as transformers does
// (the scale 1 + w in bf16 would keep 8 bits of w).
TEST(Norm, GemmasNormOnBf16IsItsFp32ComputationRoundedOnce) {
  torch::manual_seed(9);
  Norm n(17, 1e-6, NormKind::kRmsPlusOne);
  {
    torch::NoGradGuard g;
    n->weight.copy_(torch::randn({17}) * 0.01);  // small w: 1 + w in bf16 would lose it
  }
  const auto x = torch::randn({4, 17}).to(torch::kBFloat16);
  const auto want = norm_fp32(x, n->weight.detach(), torch::Tensor(), 1e-6, NormKind::kRmsPlusOne).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(n->forward(x), want));
}

// A bf16 working copy of the scale on an fp32 residual stream computes as the fp32 scale of the
// same values would, and its gradient is the fp32 gradient rounded once.
TEST(Norm, ABf16ScaleOnAnFp32InputComputesInFp32AndRoundsItsGradientOnce) {
  for (const NormKind kind : kKinds) {
    torch::manual_seed(5);
    Norm low(17, 1e-5, kind), wide(17, 1e-5, kind);
    {
      torch::NoGradGuard g;
      low->weight.copy_(torch::randn({17}));
      if (low->bias.defined()) low->bias.copy_(torch::randn({17}));
      low->to(torch::kBFloat16);
      wide->weight.copy_(low->weight.to(torch::kFloat32));
      if (wide->bias.defined()) wide->bias.copy_(low->bias.to(torch::kFloat32));
    }
    const auto x = torch::randn({6, 5, 17});
    const auto upstream = torch::randn({6, 5, 17});
    const auto y_low = low->forward(x), y_wide = wide->forward(x);
    EXPECT_EQ(y_low.scalar_type(), torch::kFloat32) << name(kind);
    EXPECT_TRUE(torch::equal(y_low, y_wide)) << name(kind);
    (y_low * upstream).sum().backward();
    (y_wide * upstream).sum().backward();
    ASSERT_EQ(low->weight.grad().scalar_type(), torch::kBFloat16) << name(kind);
    EXPECT_TRUE(torch::equal(low->weight.grad(), wide->weight.grad().to(torch::kBFloat16))) << name(kind);
  }
}

TEST(Norm, NormFp32ComputesInFp32WhateverTheDtypes) {
  for (const NormKind kind : kKinds)
    for (const int64_t dim : {1, 7, 17}) {
      torch::manual_seed(6 + dim);
      const auto x = torch::randn({2, 3, dim}).to(torch::kBFloat16);
      const auto w = torch::randn({dim}).to(torch::kBFloat16);
      const auto b = torch::randn({dim}).to(torch::kBFloat16);
      const auto bias = kind == NormKind::kLayerNorm ? b : torch::Tensor();
      const auto got = norm_fp32(x, w, bias, 1e-5, kind);
      EXPECT_EQ(got.scalar_type(), torch::kFloat32);
      // Exactly an fp32 Norm on the widened values.
      Norm n(dim, 1e-5, kind);
      {
        torch::NoGradGuard g;
        n->weight.copy_(w.to(torch::kFloat32));
        if (n->bias.defined()) n->bias.copy_(b.to(torch::kFloat32));
      }
      EXPECT_TRUE(torch::equal(got, n->forward(x.to(torch::kFloat32)))) << name(kind) << " dim " << dim;
      EXPECT_TRUE(test::AllClose(got, reference_norm(x, w, bias, 1e-5, kind), kF32Tol, kF32Tol))
          << name(kind) << " dim " << dim;
    }
}

}  // namespace
}  // namespace tandem
