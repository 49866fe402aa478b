// Paged decode attention (Note [Paged decode attention]): the reference against attend() over each
// sequence's keys laid out contiguously (CPU), and the CUDA kernel against the reference for every
// dtype, head size and grouping it takes, with windows, lengths from 1 to long enough to be split
// over several blocks, pages out of order and queries that are views.

#include "tandem/kernels/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "../test_util.h"
#include "tandem/models/attention.h"

namespace tandem {
namespace {

struct Case {
  int64_t B = 3, H = 8, KV = 2, hd = 64, page_tokens = 16, window = 0;
  std::vector<int64_t> lengths{1, 17, 40};
  torch::ScalarType dtype = torch::kFloat32;
  c10::Device device{c10::kCPU};
};

struct Inputs {
  torch::Tensor q, k_cache, v_cache, pages, lengths;
  std::vector<torch::Tensor> keys, values;  // per sequence (KV, length, hd), fp32 on the CPU
};

// Each sequence's keys and values, written into pages handed out in a shuffled order; q is a view
// (every other head of a wider tensor), as the decoder's queries are narrowed from q and k together.
Inputs make_inputs(const Case& c, uint64_t seed) {
  torch::manual_seed(static_cast<int64_t>(seed));
  Inputs in;
  const int64_t widest = (*std::max_element(c.lengths.begin(), c.lengths.end()) + c.page_tokens - 1) / c.page_tokens;
  const int64_t P = c.B * widest + 3;
  std::vector<int64_t> order(static_cast<size_t>(P));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(seed)));
  auto kc = torch::randn({P, c.KV, c.page_tokens, c.hd});
  auto vc = torch::randn({P, c.KV, c.page_tokens, c.hd});
  std::vector<int64_t> table(static_cast<size_t>(c.B * widest), order.back());  // padding: any page
  size_t next = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t len = c.lengths[static_cast<size_t>(b)];
    auto k = torch::randn({c.KV, len, c.hd}), v = torch::randn({c.KV, len, c.hd});
    for (int64_t t = 0; t < len; ++t) {
      if (t % c.page_tokens == 0) table[static_cast<size_t>(b * widest + t / c.page_tokens)] = order[next++];
      const int64_t page = table[static_cast<size_t>(b * widest + t / c.page_tokens)];
      kc[page].select(1, t % c.page_tokens).copy_(k.select(1, t));
      vc[page].select(1, t % c.page_tokens).copy_(v.select(1, t));
    }
    in.keys.push_back(k.to(c.dtype).to(torch::kFloat32));
    in.values.push_back(v.to(c.dtype).to(torch::kFloat32));
  }
  const auto opts = torch::TensorOptions().dtype(c.dtype).device(c.device);
  in.q = torch::randn({c.B, 2 * c.H, c.hd}).to(opts).view({c.B, c.H, 2, c.hd}).select(2, 0);
  in.k_cache = kc.to(opts);
  in.v_cache = vc.to(opts);
  in.pages = torch::tensor(table, torch::kInt64).view({c.B, widest}).to(c.device);
  in.lengths = torch::tensor(c.lengths, torch::kInt64).to(c.device);
  return in;
}

double scale_of(const Case& c) { return 1.0 / std::sqrt(double(c.hd)); }

TEST(PagedAttention, ReferenceEqualsAttendOverEachSequencesKeys) {
  for (const int64_t window : {int64_t{0}, int64_t{5}}) {
    Case c;
    c.window = window;
    const auto in = make_inputs(c, 1);
    const auto out = detail::paged_decode_attention_reference(in.q, in.k_cache, in.v_cache, in.pages, in.lengths,
                                                              c.window, scale_of(c));
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{c.B, c.H, c.hd}));
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t len = c.lengths[static_cast<size_t>(b)];
      auto mask = torch::ones({1, 1, 1, len}, torch::kBool);
      if (window > 0) mask = within_window(torch::arange(len).view({1, 1, 1, len}), torch::tensor(len - 1), window);
      const auto expected = attend(in.q[b].unsqueeze(0).unsqueeze(2), in.keys[b].unsqueeze(0),
                                   in.values[b].unsqueeze(0), mask, AttentionOptions{})
                                .squeeze(2)
                                .squeeze(0);
      EXPECT_TRUE(test::AllClose(out[b], expected, 1e-5, 1e-6)) << "sequence " << b << ", window " << window;
    }
  }
}

TEST(PagedAttention, CpuTensorsTakeTheReferenceAndBadShapesAreNamed) {
  Case c;
  const auto in = make_inputs(c, 2);
  EXPECT_FALSE(paged_decode_attention_supported(c10::Device(c10::kCPU), torch::kFloat32, 8, 2, 64));
  const auto out = paged_decode_attention(in.q, in.k_cache, in.v_cache, in.pages, in.lengths, 0, scale_of(c));
  const auto ref =
      detail::paged_decode_attention_reference(in.q, in.k_cache, in.v_cache, in.pages, in.lengths, 0, scale_of(c));
  EXPECT_TRUE(torch::equal(out, ref));
  const auto message = test::error_of([&] {
    paged_decode_attention(in.q, in.k_cache.narrow(3, 0, 32), in.v_cache.narrow(3, 0, 32), in.pages, in.lengths, 0,
                           1.0);
  });
  EXPECT_NE(message.find("head_dim 64 against the cache's 32"), std::string::npos) << message;
}

// The kernel against the reference on the GPU: fp32 to rounding, fp16 and bf16 within two units in
// the last place of outputs of order 1 (the reference rounds its fp32 result once, as the kernel).
TEST(PagedAttentionGpu, KernelEqualsTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  int cases = 0;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (const int64_t hd : {64, 128, 256})
      for (const auto& [H, KV] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {14, 2}, {16, 2}}) {
        Case c;
        c.dtype = dtype, c.hd = hd, c.H = H, c.KV = KV, c.device = cuda;
        c.window = (cases % 3 == 1) ? 100 : 0;
        c.B = 4;
        c.lengths = {1, 33, 300, 1500};  // 1500 keys: split over several blocks
        ASSERT_TRUE(paged_decode_attention_supported(cuda, dtype, H, KV, hd));
        const auto in = make_inputs(c, static_cast<uint64_t>(10 + cases));
        const auto out =
            paged_decode_attention(in.q, in.k_cache, in.v_cache, in.pages, in.lengths, c.window, scale_of(c));
        const auto ref = detail::paged_decode_attention_reference(in.q, in.k_cache, in.v_cache, in.pages, in.lengths,
                                                                  c.window, scale_of(c));
        ASSERT_EQ(out.scalar_type(), dtype);
        const double tol = dtype == torch::kFloat32 ? 2e-5 : dtype == torch::kFloat16 ? 2e-3 : 1.6e-2;
        EXPECT_TRUE(test::AllClose(out.cpu().to(torch::kFloat32), ref.cpu().to(torch::kFloat32), tol, tol))
            << dtype << ", head_dim " << hd << ", " << H << " heads over " << KV << ", window " << c.window;
        ++cases;
      }
  EXPECT_EQ(cases, 36);
}

// One long sequence alone (the most splits) and a batch large enough for one block a key/value
// head, both against the reference, and the unsupported shapes refused.
TEST(PagedAttentionGpu, SplitsAndWideBatchesEqualTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  for (const int64_t B : {int64_t{1}, int64_t{96}}) {
    Case c;
    c.device = cuda, c.dtype = torch::kBFloat16, c.B = B, c.H = 32, c.KV = 8, c.page_tokens = 16;
    c.lengths.clear();
    for (int64_t b = 0; b < B; ++b) c.lengths.push_back(B == 1 ? 4000 : 1 + (b * 37) % 700);
    const auto in = make_inputs(c, static_cast<uint64_t>(B));
    const auto out = paged_decode_attention(in.q, in.k_cache, in.v_cache, in.pages, in.lengths, 0, scale_of(c));
    const auto ref =
        detail::paged_decode_attention_reference(in.q, in.k_cache, in.v_cache, in.pages, in.lengths, 0, scale_of(c));
    EXPECT_TRUE(test::AllClose(out.cpu().to(torch::kFloat32), ref.cpu().to(torch::kFloat32), 1.6e-2, 1.6e-2))
        << "batch " << B;
  }
  EXPECT_FALSE(paged_decode_attention_supported(cuda, torch::kBFloat16, 8, 8, 96));   // head_dim 96
  EXPECT_FALSE(paged_decode_attention_supported(cuda, torch::kBFloat16, 32, 2, 64));  // 16 heads a group
  EXPECT_FALSE(paged_decode_attention_supported(cuda, torch::kFloat64, 8, 2, 64));
}

}  // namespace
}  // namespace tandem
