// attend() (models/attention.h) through SDPA and through the soft-capped path against a plain
// double-precision reference (causal, explicit masks, grouped heads, a scale of its own), and the
// causal and sliding-window masks entry by entry.

#include "tandem/models/attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "../test_util.h"

namespace tandem {
namespace {

// softmax(cap(q k^T * scale) masked) v in double, one (batch, head) at a time; query head h reads
// key/value head h / (H / KV). `allowed` broadcasts to (B, H, Tq, Tk); undefined = causal.
torch::Tensor reference_attention(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                                  const torch::Tensor& allowed_in, double scale, double softcap) {
  const auto q = q_in.to(torch::kFloat64), k = k_in.to(torch::kFloat64), v = v_in.to(torch::kFloat64);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), KV = k.size(1);
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(double(q.size(3)));
  torch::Tensor allowed = allowed_in;
  if (!allowed.defined()) {
    allowed = torch::ones({Tq, Tk}, torch::kBool);
    for (int64_t t = 0; t < Tq; ++t)
      for (int64_t j = t + 1; j < Tk; ++j) allowed[t][j] = false;
  }
  allowed = allowed.expand({B, H, Tq, Tk});
  auto out = torch::empty({B, H, Tq, v.size(3)}, torch::kFloat64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kv = h / (H / KV);
      auto scores = torch::matmul(q[b][h], k[b][kv].t()) * s;  // (Tq, Tk)
      if (softcap > 0) scores = torch::tanh(scores / softcap) * softcap;
      scores = scores.masked_fill(allowed[b][h].logical_not(), -std::numeric_limits<double>::infinity());
      out[b][h] = torch::matmul(torch::softmax(scores, -1), v[b][kv]);
    }
  return out;
}

struct Qkv {
  torch::Tensor q, k, v;
};

Qkv random_qkv(int64_t B, int64_t H, int64_t KV, int64_t Tq, int64_t Tk, int64_t hd, uint64_t seed,
               torch::ScalarType t = torch::kFloat32) {
  torch::manual_seed(seed);
  return {torch::randn({B, H, Tq, hd}).to(t), torch::randn({B, KV, Tk, hd}).to(t), torch::randn({B, KV, Tk, hd}).to(t)};
}

// A few dozen fp32 operations per output: tolerances from fp32's epsilon; bf16 scores, tanh and
// products in the soft-capped path: from bf16's.
constexpr double kF32Tol = 64 * std::numeric_limits<float>::epsilon();
constexpr double kBf16Tol = 4.0 / 128;

TEST(Attention, CausalAttentionMatchesTheReference) {
  for (const double softcap : {0.0, 5.0})
    for (const int64_t T : {1, 7, 17}) {
      const auto in = random_qkv(2, 4, 4, T, T, 8, 1 + T);
      const auto got = attend(in.q, in.k, in.v, torch::Tensor(), AttentionOptions{0, softcap});
      EXPECT_EQ(got.sizes(), in.q.sizes());
      EXPECT_TRUE(test::AllClose(got, reference_attention(in.q, in.k, in.v, {}, 0, softcap), kF32Tol, kF32Tol))
          << "T=" << T << " softcap " << softcap;
    }
}

TEST(Attention, GroupedHeadsReadTheirKeyValueHeadByIntegerDivision) {
  for (const double softcap : {0.0, 3.0}) {
    // 6 query heads over 2 key/value heads: heads 0..2 read kv 0, heads 3..5 read kv 1.
    const auto in = random_qkv(2, 6, 2, 17, 17, 16, 21);
    const auto got = attend(in.q, in.k, in.v, torch::Tensor(), AttentionOptions{0, softcap});
    EXPECT_TRUE(test::AllClose(got, reference_attention(in.q, in.k, in.v, {}, 0, softcap), kF32Tol, kF32Tol))
        << "softcap " << softcap;
    // The same as full multi-head attention over explicitly repeated key/value heads.
    const auto k6 = in.k.repeat_interleave(3, 1), v6 = in.v.repeat_interleave(3, 1);
    EXPECT_TRUE(
        test::AllClose(got, attend(in.q, k6, v6, torch::Tensor(), AttentionOptions{0, softcap}), kF32Tol, kF32Tol));
  }
}

TEST(Attention, AScaleOfItsOwnReplacesOneOverRootHeadDim) {
  for (const double softcap : {0.0, 4.0}) {
    const auto in = random_qkv(1, 2, 2, 7, 7, 8, 31);
    const double scale = 0.9;  // far from 1 / sqrt(8)
    const auto got = attend(in.q, in.k, in.v, torch::Tensor(), AttentionOptions{scale, softcap});
    EXPECT_TRUE(test::AllClose(got, reference_attention(in.q, in.k, in.v, {}, scale, softcap), kF32Tol, kF32Tol));
    const auto default_scale = attend(in.q, in.k, in.v, torch::Tensor(), AttentionOptions{0, softcap});
    EXPECT_FALSE(torch::allclose(got, default_scale, 1e-3, 1e-3)) << "the scale was ignored";
  }
}

TEST(Attention, TheSoftcapBoundsTheScores) {
  // Scores of a few hundred: uncapped, each query takes the value of its best key; capped at 1,
  // the weights differ by at most a factor e^2 and the output is a blend of the values.
  auto in = random_qkv(1, 1, 1, 7, 7, 8, 41);
  in.q = in.q * 30;
  const auto capped = attend(in.q, in.k, in.v, torch::Tensor(), AttentionOptions{0, 1.0});
  EXPECT_TRUE(test::AllClose(capped, reference_attention(in.q, in.k, in.v, {}, 0, 1.0), kF32Tol, kF32Tol));
  const auto uncapped = attend(in.q, in.k, in.v, torch::Tensor(), AttentionOptions{});
  EXPECT_FALSE(torch::allclose(capped.narrow(2, 1, 6), uncapped.narrow(2, 1, 6), 1e-2, 1e-2));
  // A cap far above every score changes the result by rounding only.
  const auto loose = random_qkv(2, 2, 1, 17, 17, 8, 42);
  const auto wide = attend(loose.q, loose.k, loose.v, torch::Tensor(), AttentionOptions{0, 1e6});
  EXPECT_TRUE(
      test::AllClose(wide, attend(loose.q, loose.k, loose.v, torch::Tensor(), AttentionOptions{}), kF32Tol, kF32Tol));
}

TEST(Attention, AnExplicitMaskDecidesWhichKeysAreAttended) {
  for (const double softcap : {0.0, 2.0}) {
    // Decode-like: 3 queries over 17 keys, a random mask broadcast over batch and heads with at
    // least one key per query.
    const auto in = random_qkv(2, 4, 2, 3, 17, 8, 51);
    torch::manual_seed(52);
    auto mask = torch::rand({1, 1, 3, 17}) < 0.5;
    mask.select(3, 0).fill_(true);
    const auto got = attend(in.q, in.k, in.v, mask, AttentionOptions{0, softcap});
    EXPECT_TRUE(test::AllClose(got, reference_attention(in.q, in.k, in.v, mask, 0, softcap), kF32Tol, kF32Tol))
        << "softcap " << softcap;
    // true = attend: a mask that allows key 5 alone gives its value, whatever the scores.
    auto only5 = torch::zeros({3, 17}, torch::kBool);
    only5.select(1, 5).fill_(true);
    const auto picked = attend(in.q, in.k, in.v, only5, AttentionOptions{0, softcap});
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t t = 0; t < 3; ++t)
        EXPECT_TRUE(
            test::AllClose(picked.select(1, h).select(1, t), in.v.select(1, h / 2).select(1, 5), kF32Tol, kF32Tol))
            << "head " << h << " query " << t << " softcap " << softcap;
  }
}

TEST(Attention, TheSoftcappedPathKeepsTheInputsDtype) {
  const auto in = random_qkv(1, 4, 2, 17, 17, 16, 61, torch::kBFloat16);
  const auto got = attend(in.q, in.k, in.v, torch::Tensor(), AttentionOptions{0, 5.0});
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(test::AllClose(got, reference_attention(in.q, in.k, in.v, {}, 0, 5.0), kBf16Tol, kBf16Tol));
}

TEST(Attention, CausalMaskWithAndWithoutAWindow) {
  for (const int64_t T : {1, 7, 17})
    for (const int64_t window : {0, 1, 3, 17, 100}) {
      const auto m = causal_mask(T, window, torch::kCPU);
      ASSERT_EQ(m.sizes(), (std::vector<int64_t>{T, T}));
      ASSERT_EQ(m.scalar_type(), torch::kBool);
      const auto acc = m.accessor<bool, 2>();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < T; ++s) {
          const bool want = s <= t && (window == 0 || t - s < window);
          EXPECT_EQ(acc[t][s], want) << "T=" << T << " window " << window << " query " << t << " key " << s;
        }
    }
}

TEST(Attention, WithinWindowBroadcastsAndRefusesAWindowOfZero) {
  const auto keys = torch::arange(6).view({1, 6}), queries = torch::tensor({2, 5}).view({2, 1});
  const auto w = within_window(keys, queries, 3);
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{2, 6}));
  // keys > query - 3: query 2 sees keys 0.., query 5 keys 3..
  const auto want = torch::tensor({{true, true, true, true, true, true}, {false, false, false, true, true, true}});
  EXPECT_TRUE(torch::equal(w, want)) << w;
  EXPECT_THROW(within_window(keys, queries, 0), c10::Error);
}

}  // namespace
}  // namespace tandem
