// Token choice: greedy is the argmax, top-k and top-p restrict the support to what they should, a
// seed repeats its draws, the repetition penalty moves what it should, and the batched sampler
// equals its scalar reference row by row.

#include "tandem/serve/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "../test_util.h"

namespace tandem {
namespace {

std::vector<float> row_of(const torch::Tensor& t) {
  const auto c = t.contiguous().to(torch::kFloat32);
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// Logits whose softmax at temperature 1 is `probs`.
torch::Tensor logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (const double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return torch::tensor(l).view({1, -1});
}

// The tokens drawn for uniforms spread evenly over [0, 1).
std::set<TokenId> support(const torch::Tensor& logits, const SamplingParams& p, int draws = 400) {
  std::set<TokenId> seen;
  const std::vector<TokenId> none;
  for (int i = 0; i < draws; ++i) seen.insert(sample_tokens(logits, {{&p, &none, (i + 0.5) / draws}})[0]);
  return seen;
}

TEST(ServeSampler, GreedyIsTheArgmax) {
  torch::manual_seed(1);
  const auto logits = torch::randn({6, 1000});
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::vector<TokenId> none;
  std::vector<SamplingRow> rows(6, {&greedy, &none, 0.5});
  const auto got = sample_tokens(logits, rows);
  for (int64_t b = 0; b < 6; ++b) EXPECT_EQ(got[static_cast<size_t>(b)], logits[b].argmax().item<int64_t>());
}

TEST(ServeSampler, TopKAndTopPRestrictTheSupport) {
  const auto logits = logits_of({0.05, 0.5, 0.15, 0.3});  // by probability: 1, 3, 2, 0
  SamplingParams all;
  EXPECT_EQ(support(logits, all), (std::set<TokenId>{0, 1, 2, 3}));
  SamplingParams k2;
  k2.top_k = 2;
  EXPECT_EQ(support(logits, k2), (std::set<TokenId>{1, 3}));
  SamplingParams p07;
  p07.top_p = 0.7;  // 0.5 then 0.3 (mass before it 0.5 < 0.7); then 0.15 has 0.8 before it: cut
  EXPECT_EQ(support(logits, p07), (std::set<TokenId>{1, 3}));
  SamplingParams p04;
  p04.top_p = 0.4;
  EXPECT_EQ(support(logits, p04), (std::set<TokenId>{1}));
  SamplingParams k3p09;
  k3p09.top_k = 3, k3p09.top_p = 0.9;
  EXPECT_EQ(support(logits, k3p09), (std::set<TokenId>{1, 2, 3}));
  // The draws follow the distribution: 0.5 of uniforms land on token 1.
  int ones = 0;
  const std::vector<TokenId> none;
  for (int i = 0; i < 1000; ++i) ones += sample_tokens(logits, {{&all, &none, (i + 0.5) / 1000}})[0] == 1;
  EXPECT_NEAR(ones, 500, 2);
}

TEST(ServeSampler, TemperatureSharpensAndFlattens) {
  const auto logits = logits_of({0.1, 0.6, 0.3});
  const std::vector<TokenId> none;
  const auto share_of_top = [&](double t) {
    SamplingParams p;
    p.temperature = t;
    int top = 0;
    for (int i = 0; i < 1000; ++i) top += sample_tokens(logits, {{&p, &none, (i + 0.5) / 1000}})[0] == 1;
    return top / 1000.0;
  };
  EXPECT_NEAR(share_of_top(1.0), 0.6, 0.01);
  EXPECT_GT(share_of_top(0.25), 0.9);
  EXPECT_LT(share_of_top(4.0), 0.45);
}

TEST(ServeSampler, ASeedRepeatsItsDraws) {
  SamplingRng a(42), b(42), c(43);
  std::vector<double> x, y, z;
  for (int i = 0; i < 100; ++i) x.push_back(a.uniform()), y.push_back(b.uniform()), z.push_back(c.uniform());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  for (const double u : x) EXPECT_TRUE(u >= 0 && u < 1);
}

TEST(ServeSampler, RepetitionPenaltyMovesSeenTokens) {
  const auto logits = torch::tensor({2.0f, 1.9f, -1.0f, -1.5f}).view({1, 4});
  SamplingParams p;
  p.temperature = 0, p.repetition_penalty = 2.0;
  const std::vector<TokenId> none, seen0{0, 0}, seen3{3}, seen1{1, 1, 1};
  EXPECT_EQ(sample_tokens(logits, {{&p, &none, 0}})[0], 0);
  EXPECT_EQ(sample_tokens(logits, {{&p, &seen0, 0}})[0], 1);  // 2.0 / 2 = 1.0 < 1.9
  EXPECT_EQ(sample_tokens(logits, {{&p, &seen1, 0}})[0], 0);
  // A negative logit is multiplied: token 3 falls further below token 2, once however often seen.
  SamplingParams sampled = p;
  sampled.temperature = 1;
  const auto only_negatives = torch::tensor({-1.0f, -1.0f}).view({1, 2});
  const std::vector<TokenId> seen_first{0, 0, 0};
  int first = 0;
  for (int i = 0; i < 1000; ++i)
    first += sample_tokens(only_negatives, {{&sampled, &seen_first, (i + 0.5) / 1000}})[0] == 0;
  EXPECT_NEAR(first / 1000.0, 1 / (1 + std::exp(1.0)), 0.01);  // logits -2 and -1
  EXPECT_EQ(sample_tokens(logits, {{&p, &seen3, 0}})[0], 0);
}

TEST(ServeSampler, BatchedEqualsTheReference) {
  torch::manual_seed(3);
  const int64_t B = 64, V = 300;
  const auto logits = torch::randn({B, V}) * 3;
  std::vector<SamplingParams> params(B);
  std::vector<std::vector<TokenId>> context(B);
  std::vector<SamplingRow> rows;
  SamplingRng rng(9);
  for (int64_t b = 0; b < B; ++b) {
    auto& p = params[static_cast<size_t>(b)];
    p.temperature = b % 5 == 0 ? 0.0 : 0.3 + 0.1 * double(b % 13);
    p.top_k = b % 3 == 0 ? 0 : 1 + b % 40;
    p.top_p = b % 4 == 0 ? 1.0 : 0.5 + 0.05 * double(b % 10);
    p.repetition_penalty = b % 2 == 0 ? 1.0 : 1.3;
    for (int i = 0; i < 20; ++i) context[static_cast<size_t>(b)].push_back(static_cast<TokenId>((b * 7 + i * 13) % V));
    rows.push_back({&p, &context[static_cast<size_t>(b)], rng.uniform()});
  }
  const auto got = sample_tokens(logits, rows);
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    EXPECT_EQ(got[static_cast<size_t>(b)], sample_token_reference(row_of(logits[b]), *r.params, *r.context, r.uniform))
        << "row " << b;
  }
}

TEST(ServeSampler, ParametersOutOfRangeAreRefused) {
  const auto bad = [](auto edit) {
    SamplingParams p;
    edit(p);
    return test::error_of([&] { check_sampling_params(p); });
  };
  EXPECT_NE(bad([](SamplingParams& p) { p.temperature = -1; }).find("temperature"), std::string::npos);
  EXPECT_NE(bad([](SamplingParams& p) { p.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(bad([](SamplingParams& p) { p.top_p = 0; }).find("top_p"), std::string::npos);
  EXPECT_NE(bad([](SamplingParams& p) { p.repetition_penalty = 0; }).find("repetition_penalty"), std::string::npos);
  EXPECT_EQ(bad([](SamplingParams&) {}), "");
}

}  // namespace
}  // namespace tandem
