// The models' linear maps (models/projection.h): y = x W^T + b in either stored layout against a
// double-precision reference, weights drawn by init_normal, and the zeroing of output and input
// units that keeps the feed-forward's padding out of the function.

#include "tandem/models/projection.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "../test_util.h"
#include "tandem/models/init.h"

namespace tandem {
namespace {

constexpr double kF32Tol = 16 * std::numeric_limits<float>::epsilon();

// The weight as (out, in) whatever the layout.
torch::Tensor out_in(const ProjectionImpl& p) { return p.input_major() ? p.weight.t() : p.weight; }

TEST(Projection, ShapesFollowTheLayoutAndTheBiasIsOptional) {
  for (const bool input_major : {false, true})
    for (const bool bias : {false, true}) {
      Projection p(7, 17, 0.02, bias, input_major);
      const std::vector<int64_t> want = input_major ? std::vector<int64_t>{7, 17} : std::vector<int64_t>{17, 7};
      EXPECT_EQ(p->weight.sizes().vec(), want);
      EXPECT_EQ(p->weight_shape(7, 17), want);
      EXPECT_EQ(p->weight_shape(3, 5), input_major ? (std::vector<int64_t>{3, 5}) : (std::vector<int64_t>{5, 3}));
      EXPECT_EQ(p->input_major(), input_major);
      EXPECT_EQ(p->bias.defined(), bias);
      if (bias) {
        EXPECT_TRUE(torch::equal(p->bias, torch::zeros({17})));
      }
      EXPECT_EQ(p->named_parameters().size(), bias ? 2u : 1u);
      EXPECT_TRUE(p->weight.requires_grad());
    }
}

TEST(Projection, ForwardMatchesTheReferenceInBothLayouts) {
  for (const bool input_major : {false, true})
    for (const int64_t in : {1, 7, 17}) {
      torch::manual_seed(in);
      Projection p(in, 5, 0.5, /*bias=*/true, input_major);
      {
        torch::NoGradGuard g;
        p->bias.copy_(torch::randn({5}));
      }
      const auto x = torch::randn({3, 4, in});
      const auto y = p->forward(x);
      ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 4, 5}));
      const auto ref =
          torch::matmul(x.to(torch::kFloat64), out_in(*p).to(torch::kFloat64).t()) + p->bias.to(torch::kFloat64);
      EXPECT_TRUE(test::AllClose(y, ref, kF32Tol, kF32Tol)) << "input-major " << input_major << " in " << in;
    }
}

TEST(Projection, WeightsAreInitNormalsDrawFromTheCurrentSeed) {
  for (const bool input_major : {false, true}) {
    torch::manual_seed(17);
    Projection p(300, 200, 0.02, /*bias=*/true, input_major);
    torch::manual_seed(17);
    auto want = input_major ? torch::empty({300, 200}) : torch::empty({200, 300});
    init_normal(want, 0.02);
    EXPECT_TRUE(torch::equal(p->weight, want)) << "input-major " << input_major;
  }
  torch::manual_seed(18);
  Projection big(1000, 1000, 0.05);
  const double sd = big->weight.to(torch::kFloat64).std().item<double>();
  EXPECT_NEAR(sd, 0.05, 5 * 0.05 / 1414) << "std error at 10^6 samples: std / 1414";
}

TEST(Projection, ZeroingOutputUnitsZeroesTheirWeightsAndBiasAndNothingElse) {
  for (const bool input_major : {false, true}) {
    torch::manual_seed(2);
    Projection p(7, 17, 0.5, /*bias=*/true, input_major);
    {
      torch::NoGradGuard g;
      p->bias.copy_(torch::randn({17}) + 3);
    }
    const auto w0 = out_in(*p).clone(), b0 = p->bias.clone();
    p->zero_outputs_from(12);
    const auto w = out_in(*p);
    EXPECT_TRUE(w.narrow(0, 12, 5).eq(0).all().item<bool>()) << "input-major " << input_major;
    EXPECT_TRUE(p->bias.narrow(0, 12, 5).eq(0).all().item<bool>());
    EXPECT_TRUE(torch::equal(w.narrow(0, 0, 12), w0.narrow(0, 0, 12)));
    EXPECT_TRUE(torch::equal(p->bias.narrow(0, 0, 12), b0.narrow(0, 0, 12)));
    EXPECT_TRUE(p->weight.is_leaf() && p->weight.requires_grad()) << "zeroing made the weight a non-leaf";
    // Those outputs are exactly zero.
    const auto y = p->forward(torch::randn({4, 7}));
    EXPECT_TRUE(y.narrow(1, 12, 5).eq(0).all().item<bool>());
    // From at or beyond the width: nothing changes.
    const auto w1 = p->weight.clone(), b1 = p->bias.clone();
    p->zero_outputs_from(17);
    p->zero_outputs_from(40);
    EXPECT_TRUE(torch::equal(p->weight, w1) && torch::equal(p->bias, b1));
    p->zero_outputs_from(0);
    EXPECT_TRUE(p->weight.eq(0).all().item<bool>() && p->bias.eq(0).all().item<bool>());
  }
}

TEST(Projection, ZeroingInputUnitsMakesTheOutputIgnoreThem) {
  for (const bool input_major : {false, true}) {
    torch::manual_seed(3);
    Projection p(17, 7, 0.5, /*bias=*/true, input_major);
    {
      torch::NoGradGuard g;
      p->bias.copy_(torch::randn({7}));
    }
    const auto w0 = out_in(*p).clone(), b0 = p->bias.clone();
    p->zero_inputs_from(10);
    const auto w = out_in(*p);
    EXPECT_TRUE(w.narrow(1, 10, 7).eq(0).all().item<bool>()) << "input-major " << input_major;
    EXPECT_TRUE(torch::equal(w.narrow(1, 0, 10), w0.narrow(1, 0, 10)));
    EXPECT_TRUE(torch::equal(p->bias, b0)) << "zeroing inputs touched the bias";
    auto x = torch::randn({5, 17});
    auto x2 = x.clone();
    x2.narrow(1, 10, 7).normal_(0, 100);
    EXPECT_TRUE(torch::equal(p->forward(x2), p->forward(x))) << "input-major " << input_major;
    const auto w1 = p->weight.clone();
    p->zero_inputs_from(17);
    EXPECT_TRUE(torch::equal(p->weight, w1));
  }
}

}  // namespace
}  // namespace tandem
