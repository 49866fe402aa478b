// RoPE (models/rope.h) against plain references written here, element by element with tolerances
// from the dtype: each rope_type's cos/sin table (default, linear, llama3, yarn, dynamic NTK) and
// apply_rope's rotate-half on whole and partial heads.

#include "tandem/models/rope.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "../test_util.h"

namespace tandem {
namespace {

using test::AllClose;
using test::error_of;

// The gap between 1 and the next value of `dtype`.
double eps_of(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat64:
      return std::numeric_limits<double>::epsilon();
    case torch::kFloat32:
      return std::numeric_limits<float>::epsilon();
    case torch::kBFloat16:
      return 1.0 / 128;
    case torch::kFloat16:
      return 1.0 / 1024;
    default:
      ADD_FAILURE() << "no epsilon for " << dtype;
      return 0;
  }
}

const torch::ScalarType kDtypes[] = {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16};

// head_dim 16 (8 frequencies), positions up to `max_len`.
ModelSpec rope_spec(int64_t max_len = 40) {
  ModelSpec s;
  s.d_model = 64, s.n_head = 4, s.n_kv_head = 4, s.max_seq_len = max_len, s.rope_theta = 10000;
  return s;
}

// HF's inverse frequencies of `s` for a sequence of T tokens, one dimension at a time, in fp64.
std::vector<double> reference_inv_freq(const ModelSpec& s, int64_t T) {
  const int64_t d = s.rotary_dim();
  const RopeScaling& rs = s.rope_scaling;
  const double orig = static_cast<double>(rs.original_max_position);
  double base = s.rope_theta;
  if (rs.type == RopeType::kDynamic && T > rs.original_max_position)
    base *= std::pow(rs.factor * double(T) / orig - (rs.factor - 1), double(d) / double(d - 2));
  std::vector<double> f(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) f[i] = 1.0 / std::pow(base, double(2 * i) / double(d));
  switch (rs.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:
      break;
    case RopeType::kLinear:
      for (auto& x : f) x /= rs.factor;
      break;
    case RopeType::kLlama3:
      for (auto& x : f) {
        const double wavelen = 2 * M_PI / x;
        if (wavelen < orig / rs.high_freq_factor) continue;  // short: kept
        if (wavelen > orig / rs.low_freq_factor) {           // long: interpolated
          x /= rs.factor;
          continue;
        }
        const double smooth = (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        x = (1 - smooth) * x / rs.factor + smooth * x;
      }
      break;
    case RopeType::kYarn: {
      const auto correction_dim = [&](double rotations) {
        return double(d) * std::log(orig / (rotations * 2 * M_PI)) / (2 * std::log(base));
      };
      double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
      if (rs.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0);
      high = std::min(high, double(d - 1));
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < d / 2; ++i) {
        const double interpolated = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
        f[i] = f[i] / rs.factor * interpolated + f[i] * (1 - interpolated);
      }
      break;
    }
  }
  return f;
}

// YaRN's factor on cos and sin; 1 for the other types.
double reference_scale(const RopeScaling& rs) {
  if (rs.type != RopeType::kYarn) return 1;
  if (rs.attention_factor > 0) return rs.attention_factor;
  const auto mscale = [&](double m) { return rs.factor <= 1 ? 1.0 : 0.1 * m * std::log(rs.factor) + 1.0; };
  if (rs.mscale > 0 && rs.mscale_all_dim > 0) return mscale(rs.mscale) / mscale(rs.mscale_all_dim);
  return mscale(1);
}

// cos and sin (T, rotary_dim) fp64: position p times frequency j mod d/2 (rotate-half layout), scaled.
std::pair<torch::Tensor, torch::Tensor> reference_table(const ModelSpec& s, int64_t T) {
  const auto f = reference_inv_freq(s, T);
  const int64_t d = s.rotary_dim(), half = d / 2;
  const double scale = reference_scale(s.rope_scaling);
  auto cos = torch::empty({T, d}, torch::kFloat64), sin = torch::empty({T, d}, torch::kFloat64);
  auto c = cos.accessor<double, 2>(), sn = sin.accessor<double, 2>();
  for (int64_t p = 0; p < T; ++p)
    for (int64_t j = 0; j < d; ++j) {
      const double angle = double(p) * f[j % half];
      c[p][j] = scale * std::cos(angle);
      sn[p][j] = scale * std::sin(angle);
    }
  return {cos, sin};
}

// rope's table for T tokens in `dtype` against the reference. The table is kept in fp32, so no
// dtype is closer to the reference than fp32's epsilon.
::testing::AssertionResult TableMatches(RopeTable& rope, const ModelSpec& s, int64_t T, torch::ScalarType dtype) {
  const auto [cos, sin] = rope.get(T, torch::kCPU, dtype);
  if (cos.scalar_type() != dtype || sin.scalar_type() != dtype)
    return ::testing::AssertionFailure() << "dtype " << cos.scalar_type() << ", asked for " << dtype;
  if (!cos.device().is_cpu()) return ::testing::AssertionFailure() << "not on the CPU";
  const auto [ref_cos, ref_sin] = reference_table(s, T);
  const double eps = std::max(eps_of(dtype), eps_of(torch::kFloat32));
  const double scale = reference_scale(s.rope_scaling);
  auto r = AllClose(cos, ref_cos, eps, eps * scale);
  if (!r) return r << " (cos, T " << T << ", " << dtype << ")";
  r = AllClose(sin, ref_sin, eps, eps * scale);
  if (!r) return r << " (sin, T " << T << ", " << dtype << ")";
  return ::testing::AssertionSuccess();
}

// x (..., hd) rotated by cos and sin (T, d), d <= hd, in fp64 one element at a time.
torch::Tensor reference_apply(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto xd = x.to(torch::kFloat64).contiguous();
  auto out = xd.clone();
  const auto c = cos.to(torch::kFloat64).contiguous(), s = sin.to(torch::kFloat64).contiguous();
  const int64_t T = x.size(-2), hd = x.size(-1), d = cos.size(-1), half = d / 2;
  const int64_t rows = xd.numel() / (T * hd);
  auto x3 = xd.view({rows, T, hd}), out3 = out.view({rows, T, hd});
  auto xa = x3.accessor<double, 3>(), oa = out3.accessor<double, 3>();
  auto ca = c.accessor<double, 2>(), sa = s.accessor<double, 2>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double a = xa[r][t][i], b = xa[r][t][i + half];
        oa[r][t][i] = a * ca[t][i] - b * sa[t][i];
        oa[r][t][i + half] = b * ca[t][i + half] + a * sa[t][i + half];
      }
  return out;
}

TEST(RopeTable, DefaultTableIsCosAndSinOfPositionTimesFrequency) {
  const ModelSpec s = rope_spec();
  RopeTable rope(s);
  EXPECT_FALSE(rope.depends_on_length());
  for (torch::ScalarType dtype : kDtypes)
    for (int64_t T : {1, 17, 40}) EXPECT_TRUE(TableMatches(rope, s, T, dtype));
  const auto [cos, sin] = rope.get(17, torch::kCPU, torch::kFloat32);
  EXPECT_EQ(cos.sizes(), (std::vector<int64_t>{17, 16}));
  EXPECT_EQ(sin.sizes(), (std::vector<int64_t>{17, 16}));
}

TEST(RopeTable, LinearScalingStretchesThePositions) {
  ModelSpec s = rope_spec();
  s.rope_scaling.type = RopeType::kLinear;
  s.rope_scaling.factor = 2.5;
  RopeTable rope(s);
  for (torch::ScalarType dtype : kDtypes) EXPECT_TRUE(TableMatches(rope, s, 40, dtype));
  // Factor 2: position 2p of the scaled table is position p of the plain one, exactly.
  s.rope_scaling.factor = 2;
  RopeTable twice(s);
  RopeTable plain(rope_spec());
  const auto scaled = twice.get(40, torch::kCPU, torch::kFloat32).first;
  const auto unscaled = plain.get(20, torch::kCPU, torch::kFloat32).first;
  EXPECT_TRUE(torch::equal(scaled.index({torch::indexing::Slice(0, 40, 2)}), unscaled));
}

TEST(RopeTable, Llama3KeepsShortWavelengthsScalesLongOnesAndBlendsBetween) {
  // Wavelengths 2π·10000^(i/8): 6.3 and 19.9, 62.8 and 199, ...; with an original length of 64 and
  // frequency factors 1 and 4 the bounds are 16 and 64: dimension 0 is kept, 1 and 2 are blended,
  // 3 to 7 are divided by the factor.
  ModelSpec s = rope_spec();
  s.rope_scaling.type = RopeType::kLlama3;
  s.rope_scaling.factor = 8;
  s.rope_scaling.low_freq_factor = 1;
  s.rope_scaling.high_freq_factor = 4;
  s.rope_scaling.original_max_position = 64;
  RopeTable rope(s);
  EXPECT_FALSE(rope.depends_on_length());
  for (torch::ScalarType dtype : kDtypes) EXPECT_TRUE(TableMatches(rope, s, 40, dtype));

  ModelSpec linear = rope_spec();
  linear.rope_scaling.type = RopeType::kLinear;
  linear.rope_scaling.factor = 8;
  RopeTable plain(rope_spec()), divided(linear);
  const auto l3 = rope.get(40, torch::kCPU, torch::kFloat32).second;
  const auto kept = plain.get(40, torch::kCPU, torch::kFloat32).second;
  const auto scaled = divided.get(40, torch::kCPU, torch::kFloat32).second;
  using torch::indexing::Slice;
  for (int64_t j : {0, 8}) EXPECT_TRUE(torch::equal(l3.index({Slice(), j}), kept.index({Slice(), j}))) << j;
  for (int64_t j : {3, 4, 5, 6, 7, 11, 15})
    EXPECT_TRUE(torch::equal(l3.index({Slice(), j}), scaled.index({Slice(), j}))) << j;
  // Blended: the angle at position 1 lies strictly between the scaled and the kept one.
  for (int64_t j : {1, 2}) {
    const double a = l3[1][j].item<double>(), lo = scaled[1][j].item<double>(), hi = kept[1][j].item<double>();
    EXPECT_GT(a, lo) << j;
    EXPECT_LT(a, hi) << j;
  }
}

TEST(RopeTable, YarnRampsBetweenItsCorrectionBoundsAndScalesCosAndSin) {
  // Original length 4096, betas 32 and 1: the correction range [2.6, 5.6] rounds out to [2, 6].
  ModelSpec s = rope_spec();
  s.rope_scaling.type = RopeType::kYarn;
  s.rope_scaling.factor = 4;
  s.rope_scaling.original_max_position = 4096;
  {
    RopeTable rope(s);
    for (torch::ScalarType dtype : kDtypes) EXPECT_TRUE(TableMatches(rope, s, 40, dtype));
    // Position 0: cos is the attention factor 0.1 ln 4 + 1 in every dimension, sin is 0.
    const auto [cos, sin] = rope.get(1, torch::kCPU, torch::kFloat64);
    const double factor = 0.1 * std::log(4.0) + 1;
    EXPECT_TRUE(AllClose(cos, torch::full({1, 16}, factor, torch::kFloat64), 2e-7, 0));
    EXPECT_TRUE(torch::equal(sin, torch::zeros({1, 16}, torch::kFloat64)));
  }
  s.rope_scaling.truncate = false;  // the ramp over [2.6, 5.6] itself
  {
    RopeTable rope(s);
    EXPECT_TRUE(TableMatches(rope, s, 40, torch::kFloat32));
  }
  s.rope_scaling.attention_factor = 0.5;
  {
    RopeTable rope(s);
    EXPECT_TRUE(TableMatches(rope, s, 40, torch::kFloat32));
    EXPECT_FLOAT_EQ(rope.get(1, torch::kCPU, torch::kFloat32).first[0][5].item<float>(), 0.5f);
  }
  s.rope_scaling.attention_factor = 0;
  s.rope_scaling.mscale = 0.707;
  s.rope_scaling.mscale_all_dim = 0.707;  // DeepSeek's equal pair: no scaling
  {
    RopeTable rope(s);
    EXPECT_TRUE(TableMatches(rope, s, 40, torch::kFloat32));
    EXPECT_FLOAT_EQ(rope.get(1, torch::kCPU, torch::kFloat32).first[0][0].item<float>(), 1.0f);
  }
  s.rope_scaling.mscale = 1.0;
  s.rope_scaling.mscale_all_dim = 0.5;
  {
    RopeTable rope(s);
    EXPECT_TRUE(TableMatches(rope, s, 40, torch::kFloat32));
  }
}

TEST(RopeTable, DynamicScalingRaisesTheBaseOnlyBeyondTheOriginalLength) {
  ModelSpec s = rope_spec(40);
  s.rope_scaling.type = RopeType::kDynamic;
  s.rope_scaling.factor = 2;
  s.rope_scaling.original_max_position = 24;
  RopeTable rope(s);
  EXPECT_TRUE(rope.depends_on_length());
  const ModelSpec plain = rope_spec(40);
  for (int64_t T : {1, 20, 24}) EXPECT_TRUE(TableMatches(rope, plain, T, torch::kFloat32)) << "T " << T;
  // Beyond 24 each length has its own table; asking again after another length gives it again.
  for (int64_t T : {32, 40, 25, 32}) EXPECT_TRUE(TableMatches(rope, s, T, torch::kFloat32)) << "T " << T;
  for (torch::ScalarType dtype : kDtypes) EXPECT_TRUE(TableMatches(rope, s, 33, dtype));
  const auto t32 = rope.get(32, torch::kCPU, torch::kFloat32).first;
  const auto t40 = rope.get(40, torch::kCPU, torch::kFloat32).first.narrow(0, 0, 32);
  EXPECT_FALSE(torch::allclose(t32, t40)) << "a longer sequence rotates its first positions differently";
  EXPECT_TRUE(TableMatches(rope, plain, 24, torch::kFloat32)) << "and the original length is plain again";
}

TEST(RopeTable, PartialRotaryFactorMakesANarrowerTable) {
  ModelSpec s = rope_spec();
  s.parts.rotary_fraction = 0.5;
  ASSERT_EQ(s.rotary_dim(), 8);
  RopeTable rope(s);
  EXPECT_EQ(rope.get(9, torch::kCPU, torch::kFloat32).first.sizes(), (std::vector<int64_t>{9, 8}));
  EXPECT_TRUE(TableMatches(rope, s, 40, torch::kFloat32)) << "frequencies over the rotated 8 dimensions";
}

TEST(RopeTable, ASequenceLongerThanTheModelIsAUserError) {
  RopeTable rope(rope_spec(40));
  const std::string msg = error_of([&] { rope.get(41, torch::kCPU, torch::kFloat32); });
  EXPECT_NE(msg.find("sequence length 41 exceeds model.max_seq_len 40; lower train.seq_len or raise "
                     "model.max_seq_len"),
            std::string::npos)
      << msg;
  EXPECT_EQ(error_of([&] { rope.get(40, torch::kCPU, torch::kFloat32); }), "");
}

TEST(RopeTable, TablesAreCachedPerDtypeAndShorterSequencesShareThem) {
  RopeTable rope(rope_spec());
  const auto a = rope.get(10, torch::kCPU, torch::kBFloat16).first;
  const auto b = rope.get(10, torch::kCPU, torch::kBFloat16).first;
  const auto shorter = rope.get(3, torch::kCPU, torch::kBFloat16).first;
  const auto other = rope.get(10, torch::kCPU, torch::kFloat32).first;
  EXPECT_EQ(a.data_ptr(), b.data_ptr());
  EXPECT_EQ(a.data_ptr(), shorter.data_ptr());
  EXPECT_NE(a.data_ptr(), other.data_ptr());
}

TEST(ApplyRope, RotatesHalvesAsTheReferenceInEachDtype) {
  torch::manual_seed(7);
  const ModelSpec s = rope_spec();
  RopeTable rope(s);
  for (torch::ScalarType dtype : kDtypes) {
    const auto x = torch::randn({2, 3, 7, 16}).to(dtype);  // (B, H, T, hd)
    const auto [cos, sin] = rope.get(7, torch::kCPU, dtype);
    const auto y = apply_rope(x, cos, sin);
    ASSERT_EQ(y.scalar_type(), dtype);
    // Each output is a*c - b*s rounded three times: within eps of the terms' size.
    const double eps = eps_of(dtype), size = x.abs().max().item<double>();
    EXPECT_TRUE(AllClose(y, reference_apply(x, cos, sin), eps, eps * size)) << dtype;
  }
}

TEST(ApplyRope, APartialRotationLeavesTheOtherDimensionsAsTheyAre) {
  torch::manual_seed(8);
  ModelSpec s = rope_spec();
  s.d_model = 48;  // head_dim 12
  s.parts.rotary_fraction = 0.5;
  ASSERT_EQ(s.rotary_dim(), 6);
  RopeTable rope(s);
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto x = torch::randn({1, 2, 5, 12}).to(dtype);
    const auto [cos, sin] = rope.get(5, torch::kCPU, dtype);
    const auto y = apply_rope(x, cos, sin);
    ASSERT_EQ(y.sizes(), x.sizes());
    EXPECT_TRUE(torch::equal(y.narrow(-1, 6, 6), x.narrow(-1, 6, 6))) << dtype;
    const double eps = eps_of(dtype), size = x.abs().max().item<double>();
    EXPECT_TRUE(AllClose(y, reference_apply(x, cos, sin), eps, eps * size)) << dtype;
  }
}

// What RoPE is for: the score of a query and a key depends on how far apart they are, not where.
TEST(ApplyRope, ScoresDependOnlyOnTheDistanceBetweenPositions) {
  torch::manual_seed(9);
  for (RopeType type : {RopeType::kDefault, RopeType::kLinear, RopeType::kYarn}) {
    ModelSpec s = rope_spec();
    s.rope_scaling.type = type;
    s.rope_scaling.factor = 3;
    s.rope_scaling.original_max_position = 4096;
    RopeTable rope(s);
    const auto table = rope.get(40, torch::kCPU, torch::kFloat64);
    const torch::Tensor &cos = table.first, &sin = table.second;
    const auto q = torch::randn({1, 1, 1, 16}, torch::kFloat64), k = torch::randn({1, 1, 1, 16}, torch::kFloat64);
    const auto score = [&](int64_t pq, int64_t pk) {
      const auto rq = apply_rope(q, cos.narrow(0, pq, 1), sin.narrow(0, pq, 1));
      const auto rk = apply_rope(k, cos.narrow(0, pk, 1), sin.narrow(0, pk, 1));
      return (rq * rk).sum().item<double>();
    };
    const double tol = 1e-5 * q.norm().item<double>() * k.norm().item<double>();
    const double at_start = score(5, 0);
    EXPECT_NEAR(score(14, 9), at_start, tol);
    EXPECT_NEAR(score(39, 34), at_start, tol);
    EXPECT_GT(std::abs(score(6, 0) - at_start), 100 * tol) << "another distance, another score";
  }
}

}  // namespace
}  // namespace tandem
