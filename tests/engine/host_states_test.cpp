// A Block's host Adam moments (engine/host_states.h): allocation per dtype with 8-bit scales per
// parameter slice, reads and writes of the slice or one parameter (bf16 rounded, 8-bit within Note
// [8-bit states]'s precision, padding zero), decoded states encoding back to the same codes, undo copies.
#include "tandem/engine/host_states.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "../test_util.h"
#include "tandem/engine/param_store.h"

namespace tandem {
namespace {

// Two parameters, one element past a scale block and exactly one block, then 3 elements of padding:
// scales 2 + 1.
constexpr int64_t kA = 2049, kB = 2048, kPad = 3, kSlice = kA + kB + kPad;

BlockStore two_params() {
  BlockStore b;
  b.name = "layer.0";
  FlatParam a, c;
  a.name = "w_a", a.offset = 0, a.numel = kA, a.shape = {kA};
  c.name = "w_b", c.offset = kA, c.numel = kB, c.shape = {kB};
  b.params = {a, c};
  b.shard_params = b.params;
  b.numel = kA + kB;
  b.shard_numel = b.padded_numel = kSlice;
  return b;
}

torch::Tensor zeroed(int64_t n, torch::ScalarType t) { return torch::zeros({n}, t); }

BlockStore allocated(torch::ScalarType dtype) {
  BlockStore b = two_params();
  allocate_host_states(b, dtype, zeroed);
  return b;
}

// Moments with a wide range of magnitudes; v > 0; the padding non-zero (it must be ignored).
std::pair<torch::Tensor, torch::Tensor> moments(uint64_t seed) {
  torch::manual_seed(seed);
  auto m = torch::randn({kSlice}) * torch::pow(10.0, torch::randint(-4, 2, {kSlice}).to(torch::kFloat32));
  auto v = torch::rand({kSlice}) * 1e-2 + 1e-8;
  m.narrow(0, kA + kB, kPad).fill_(7);
  v.narrow(0, kA + kB, kPad).fill_(7);
  return {m, v};
}

TEST(HostStates, Fp32AndBf16StatesAreOneBufferEachWithoutScales) {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    std::vector<std::pair<int64_t, torch::ScalarType>> calls;
    BlockStore b = two_params();
    allocate_host_states(b, dtype, [&](int64_t n, torch::ScalarType t) {
      calls.emplace_back(n, t);
      return torch::zeros({n}, t);
    });
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0], std::make_pair(kSlice, dtype));
    EXPECT_EQ(calls[1], std::make_pair(kSlice, dtype));
    EXPECT_FALSE(q8_states(b));
    EXPECT_FALSE(b.m_scale.defined());
    EXPECT_FALSE(b.v_scale.defined());
  }
}

TEST(HostStates, EightBitStatesGetCodesAndAScalePer2048ElementsOfEachParameter) {
  std::vector<std::pair<int64_t, torch::ScalarType>> calls;
  BlockStore b = two_params();
  allocate_host_states(b, torch::kInt8, [&](int64_t n, torch::ScalarType t) {
    calls.emplace_back(n, t);
    return torch::zeros({n}, t);
  });
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0], std::make_pair(kSlice, torch::kInt8)) << "m: signed codes";
  EXPECT_EQ(calls[1], std::make_pair(kSlice, torch::kUInt8)) << "v: unsigned codes of sqrt(v)";
  EXPECT_EQ(calls[2], std::make_pair(int64_t{3}, torch::kFloat32)) << "2049 elements: 2 scales; 2048: 1";
  EXPECT_EQ(calls[3], std::make_pair(int64_t{3}, torch::kFloat32));
  EXPECT_TRUE(q8_states(b));
  EXPECT_EQ(b.shard_params[0].scale_offset, 0);
  EXPECT_EQ(b.shard_params[1].scale_offset, 2) << "each parameter owns its scales, in order";
}

TEST(HostStates, Fp32StatesAreReadInPlaceAndWrittenExactly) {
  BlockStore b = allocated(torch::kFloat32);
  const auto [m, v] = moments(1);
  set_states(b, m, v);
  EXPECT_TRUE(torch::equal(b.m, m));
  EXPECT_TRUE(torch::equal(b.v, v));
  const auto [rm, rv] = states_f32(b);
  EXPECT_EQ(rm.data_ptr(), b.m.data_ptr()) << "fp32 states are returned as they are, not copied";
  EXPECT_EQ(rv.data_ptr(), b.v.data_ptr());
  // A 2-D source of another dtype is copied in as a flat slice.
  set_states(b, m.to(torch::kFloat64).reshape({2, kSlice / 2}), v.reshape({kSlice / 2, 2}));
  EXPECT_TRUE(torch::equal(b.m, m));
}

TEST(HostStates, Bf16StatesRoundToBf16AndReadBackAsFp32Copies) {
  BlockStore b = allocated(torch::kBFloat16);
  const auto [m, v] = moments(2);
  set_states(b, m, v);
  const auto [rm, rv] = states_f32(b);
  EXPECT_EQ(rm.scalar_type(), torch::kFloat32);
  EXPECT_NE(rm.data_ptr(), b.m.data_ptr());
  EXPECT_TRUE(torch::equal(rm, m.to(torch::kBFloat16).to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(rv, v.to(torch::kBFloat16).to(torch::kFloat32)));
}

// Note [8-bit states]: m to 3 mantissa bits (relative error <= 1/16), sqrt(v) to 4 (<= 1/32), both
// relative to their block's largest value, below 2^-16 of it m is 0 and sqrt(v) its smallest code.
::testing::AssertionResult within_q8(const torch::Tensor& got_m, const torch::Tensor& got_v, const torch::Tensor& m,
                                     const torch::Tensor& v) {
  for (int64_t o = 0; o < got_m.numel(); o += 2048) {
    const int64_t n = std::min<int64_t>(2048, got_m.numel() - o);
    const auto bm = m.narrow(0, o, n).to(torch::kFloat64), gm = got_m.narrow(0, o, n).to(torch::kFloat64);
    const auto bu = v.narrow(0, o, n).to(torch::kFloat64).sqrt(), gu = got_v.narrow(0, o, n).to(torch::kFloat64).sqrt();
    const double ms = bm.abs().max().item<double>(), us = bu.max().item<double>();
    // (1e-6: the decoded value is the code times the scale, rounded to fp32 once more)
    const auto m_excess = (gm - bm).abs() - (bm.abs() * (1.0 / 16 + 1e-6) + ms * std::ldexp(1.0, -15));
    const auto u_excess = (gu - bu).abs() - (bu * (1.0 / 32 + 1e-6) + us * std::ldexp(1.0, -15));
    if (m_excess.max().item<double>() > 0) {
      const int64_t i = m_excess.argmax().item<int64_t>();
      return ::testing::AssertionFailure() << "m[" << o + i << "] = " << gm[i].item<double>() << ", want "
                                           << bm[i].item<double>() << " (block max " << ms << ")";
    }
    if (u_excess.max().item<double>() > 0) {
      const int64_t i = u_excess.argmax().item<int64_t>();
      return ::testing::AssertionFailure() << "sqrt(v)[" << o + i << "] = " << gu[i].item<double>() << ", want "
                                           << bu[i].item<double>() << " (block max " << us << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(HostStates, EightBitStatesDecodeWithinTheirPrecisionAndLeaveThePaddingZero) {
  BlockStore b = allocated(torch::kInt8);
  const auto [m, v] = moments(3);
  set_states(b, m, v);
  const auto [rm, rv] = states_f32(b);
  ASSERT_EQ(rm.numel(), kSlice);
  EXPECT_EQ(rm.scalar_type(), torch::kFloat32);
  for (size_t k = 0; k < b.shard_params.size(); ++k) {
    SCOPED_TRACE(b.shard_params[k].name);
    const FlatParam& f = b.shard_params[k];
    EXPECT_TRUE(within_q8(rm.narrow(0, f.offset, f.numel), rv.narrow(0, f.offset, f.numel),
                          m.narrow(0, f.offset, f.numel), v.narrow(0, f.offset, f.numel)));
  }
  EXPECT_EQ(rm.narrow(0, kA + kB, kPad).abs().sum().item<float>(), 0.0f) << "the padding reads as zero";
  EXPECT_EQ(rv.narrow(0, kA + kB, kPad).abs().sum().item<float>(), 0.0f);
  EXPECT_FALSE(torch::equal(rm, m)) << "8-bit codes do not hold random fp32 values exactly";
}

TEST(HostStates, ValuesOnTheCodeGridRoundTripExactly) {
  BlockStore b = allocated(torch::kInt8);
  auto m = torch::zeros({kSlice}), v = torch::zeros({kSlice});
  // Each parameter's first block: its largest magnitude 1 and values of 3 (m) or 4 (sqrt v) mantissa bits.
  for (const int64_t o : {int64_t{0}, kA}) {
    m.narrow(0, o, 4).copy_(torch::tensor({1.0f, -0.5f, 0.75f, -0.625f}));
    v.narrow(0, o, 3).copy_(torch::tensor({1.0f, 0.25f, 0.5625f}));
  }
  m[2048] = 3.0f;  // w_a's second block: its own scale
  v[2048] = 9.0f;
  set_states(b, m, v);
  const auto [rm, rv] = states_f32(b);
  EXPECT_TRUE(torch::equal(rm, m)) << "m = 0 is exact";
  for (const int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{2048}, kA, kA + 1, kA + 2})
    EXPECT_EQ(rv[i].item<float>(), v[i].item<float>()) << "element " << i;
  // A zero v is stored as the smallest code, never as 0 (it only ever enlarges Adam's denominator).
  EXPECT_GT(rv[5].item<float>(), 0.0f);
  EXPECT_LT(rv[5].item<float>(), std::ldexp(1.0f, -28));
}

TEST(HostStates, AllZeroStatesDecodeToExactZeros) {
  BlockStore b = allocated(torch::kInt8);
  set_states(b, torch::zeros({kSlice}), torch::zeros({kSlice}));
  EXPECT_EQ(b.m_scale.abs().sum().item<float>(), 0.0f) << "a zero block has a zero scale";
  const auto [rm, rv] = states_f32(b);
  EXPECT_EQ(rm.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(rv.abs().sum().item<float>(), 0.0f);
}

TEST(HostStates, DecodedStatesEncodeBackToTheSameCodes) {
  BlockStore b = allocated(torch::kInt8);
  const auto [m, v] = moments(4);
  set_states(b, m, v);
  const auto codes_m = b.m.clone(), codes_v = b.v.clone(), scales_m = b.m_scale.clone(), scales_v = b.v_scale.clone();
  const auto [rm, rv] = states_f32(b);  // as a checkpoint holds them
  BlockStore resumed = allocated(torch::kInt8);
  set_states(resumed, rm, rv);
  EXPECT_TRUE(torch::equal(resumed.m.narrow(0, 0, kA + kB), codes_m.narrow(0, 0, kA + kB)));
  EXPECT_TRUE(torch::equal(resumed.v.narrow(0, 0, kA + kB), codes_v.narrow(0, 0, kA + kB)));
  EXPECT_TRUE(torch::equal(resumed.m_scale, scales_m));
  EXPECT_TRUE(torch::equal(resumed.v_scale, scales_v));
}

TEST(HostStates, OneParametersStatesAreReadAndWrittenAlone) {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kInt8}) {
    SCOPED_TRACE(c10::toString(dtype));
    BlockStore b = allocated(dtype);
    const auto [m, v] = moments(5);
    set_states(b, m, v);
    const auto m_before = b.m.clone(), v_before = b.v.clone();
    const auto scales_before = q8_states(b) ? b.m_scale.clone() : torch::Tensor();
    // w_b's states from a 2-D double tensor.
    const auto new_m = torch::linspace(-1.0, 1.0, kB, torch::kFloat64).reshape({32, 64});
    const auto new_v = torch::linspace(0.0, 4.0, kB, torch::kFloat64).reshape({64, 32});
    set_param_states(b, 1, new_m, new_v);
    EXPECT_TRUE(torch::equal(b.m.narrow(0, 0, kA), m_before.narrow(0, 0, kA))) << "w_a untouched";
    EXPECT_TRUE(torch::equal(b.v.narrow(0, 0, kA), v_before.narrow(0, 0, kA)));
    EXPECT_TRUE(torch::equal(b.m.narrow(0, kA + kB, kPad), m_before.narrow(0, kA + kB, kPad))) << "padding untouched";
    if (q8_states(b)) {
      EXPECT_TRUE(torch::equal(b.m_scale.narrow(0, 0, 2), scales_before.narrow(0, 0, 2))) << "w_a's scales untouched";
      EXPECT_FLOAT_EQ(b.m_scale[2].item<float>(), 1.0f) << "w_b's scale: its largest |m|";
    }
    const auto [pm, pv] = param_states_f32(b, 1);
    ASSERT_EQ(pm.numel(), kB);
    EXPECT_EQ(pm.dim(), 1);
    EXPECT_EQ(pm.scalar_type(), torch::kFloat32);
    const auto want_m = new_m.reshape({-1}).to(torch::kFloat32), want_v = new_v.reshape({-1}).to(torch::kFloat32);
    if (dtype == torch::kInt8) {
      EXPECT_TRUE(within_q8(pm, pv, want_m, want_v));
    } else {  // rounded once, from the given values
      EXPECT_TRUE(torch::equal(pm, new_m.reshape({-1}).to(dtype).to(torch::kFloat32)));
      EXPECT_TRUE(torch::equal(pv, new_v.reshape({-1}).to(dtype).to(torch::kFloat32)));
    }
    const auto [am, av] = param_states_f32(b, 0);
    EXPECT_EQ(am.numel(), kA);
    if (dtype == torch::kFloat32) {
      EXPECT_TRUE(torch::equal(am, m.narrow(0, 0, kA)));
    }
  }
}

TEST(HostStates, AParametersFp32ReadIsAViewOfTheStoreOtherwiseACopy) {
  // fp32 states are handed out as they live (torch's optimizers hand out their live state, and a
  // 7B model's would otherwise be copied whole); bf16 ones are decoded into a copy.
  BlockStore b = allocated(torch::kFloat32);
  const auto [m, v] = moments(6);
  set_states(b, m, v);
  auto [pm, pv] = param_states_f32(b, 0);
  EXPECT_EQ(pm.data_ptr(), b.m.data_ptr());
  pm.fill_(123);
  EXPECT_EQ(b.m[0].item<float>(), 123.0f) << "the view is the store's";
  BlockStore h = allocated(torch::kBFloat16);
  set_states(h, m, v);
  auto [hm, hv] = param_states_f32(h, 0);
  EXPECT_EQ(hm.scalar_type(), torch::kFloat32);
  hm.fill_(123);
  EXPECT_NE(h.m[0].item<float>(), 123.0f) << "writing the decoded copy leaves the store's states";
}

TEST(HostStates, StatesOfTheWrongSizeAreABug) {
  BlockStore b = allocated(torch::kInt8);
  EXPECT_THROW(set_states(b, torch::zeros({kSlice - 1}), torch::zeros({kSlice})), InternalError);
  EXPECT_THROW(set_param_states(b, 0, torch::zeros({kA}), torch::zeros({kB})), InternalError);
  EXPECT_THROW(param_states_f32(b, 2), std::out_of_range) << "there is no third parameter";
}

TEST(HostStates, UndoCopiesMatchTheStatesLayout) {
  BlockStore q = allocated(torch::kInt8);
  allocate_undo_states(q);
  EXPECT_EQ(q.undo_master.scalar_type(), torch::kFloat32);
  EXPECT_EQ(q.undo_master.numel(), kSlice);
  EXPECT_EQ(q.undo_m.scalar_type(), torch::kInt8);
  EXPECT_EQ(q.undo_v.scalar_type(), torch::kUInt8);
  EXPECT_EQ(q.undo_m.numel(), kSlice);
  ASSERT_TRUE(q.undo_m_scale.defined());
  EXPECT_EQ(q.undo_m_scale.sizes(), q.m_scale.sizes());
  EXPECT_EQ(q.undo_v_scale.sizes(), q.v_scale.sizes());

  BlockStore h = allocated(torch::kBFloat16);
  allocate_undo_states(h);
  EXPECT_EQ(h.undo_m.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(h.undo_v.numel(), kSlice);
  EXPECT_FALSE(h.undo_m_scale.defined()) << "no scales without 8-bit states";
}

}  // namespace
}  // namespace tandem
