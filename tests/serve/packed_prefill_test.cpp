// Note [Packed prefill attention]: the packing of a step's prefill chunks (CPU), and the
// variable-length attention over a paged cache against each chunk's masked attention (GPU).

#include "tandem/serve/packed_prefill.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "serve_test_util.h"
#include "tandem/models/attention.h"

namespace tandem {
namespace {

using torch::indexing::Slice;

std::vector<int64_t> values(const torch::Tensor& t) {
  const auto c = t.to(torch::kCPU, torch::kInt64).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(PackedPrefill, ChunksLayTheirQueriesAndTheirSequencesKeysOutInOrder) {
  PageTable a{{5}}, b{{2, 7}};
  // a fresh chunk of 3 tokens, then 2 tokens continuing a sequence of 6 cached ones (pages of 4)
  const auto p = pack_prefills({{&a, 0, 3}, {&b, 6, 2}}, 4, c10::kCPU);
  EXPECT_EQ(p.max_q, 3);
  EXPECT_EQ(p.max_k, 8);
  EXPECT_EQ(p.cu_q.scalar_type(), torch::kInt32);
  EXPECT_EQ(values(p.cu_q), (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(values(p.cu_k), (std::vector<int64_t>{0, 3, 11}));
  EXPECT_EQ(values(p.key_page), (std::vector<int64_t>{5, 5, 5, 2, 2, 2, 2, 7, 7, 7, 7}));
  EXPECT_EQ(values(p.key_slot), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(pack_prefills({}, 4, c10::kCPU).max_q, 0);
}

TEST(PackedPrefill, TakesHalfPrecisionOnCudaWithoutASoftcap) {
  const c10::Device cuda(c10::kCUDA, 0);
  EXPECT_TRUE(packed_prefill_supported(cuda, torch::kBFloat16, 64, 0));
  EXPECT_TRUE(packed_prefill_supported(cuda, torch::kFloat16, 128, 0));
  EXPECT_FALSE(packed_prefill_supported(c10::kCPU, torch::kBFloat16, 64, 0));
  EXPECT_FALSE(packed_prefill_supported(cuda, torch::kFloat32, 64, 0));
  EXPECT_FALSE(packed_prefill_supported(cuda, torch::kBFloat16, 64, 50.0));  // Gemma2's soft cap
  EXPECT_FALSE(packed_prefill_supported(cuda, torch::kBFloat16, 60, 0));
  EXPECT_FALSE(packed_prefill_supported(cuda, torch::kBFloat16, 512, 0));
}

// Chunks of a fresh prompt, a continuation crossing pages, a one-token one and a long one (then
// one-token chunks alone, where the kernel's causal mask has nothing to cut), over pages out of
// order, grouped queries (4 over 2), a scale of its own: each chunk's rows against attend() with the
// chunk's mask (key <= start + t, within the window) over its keys, in fp32 on the same bf16 inputs.
TEST(PackedPrefillGpu, EqualsEachChunksMaskedAttention) {
  REQUIRE_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  const int64_t pt = 4, H = 4, KV = 2, hd = 64, P = 40;
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(cuda);
  const auto kc = torch::randn({P, KV, pt, hd}, opts), vc = torch::randn({P, KV, pt, hd}, opts);
  std::vector<PageTable> tables{{{9, 3}}, {{1, 30, 4, 12}}, {{20}}, {{0, 6, 7, 8, 10, 11, 13, 14, 15}}};
  for (const auto& start_count : {std::vector<std::pair<int64_t, int64_t>>{{0, 7}, {6, 9}, {2, 1}, {5, 31}},
                                  std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {14, 1}, {3, 1}, {35, 1}}}) {
    std::vector<PrefillChunk> chunks;
    int64_t rows = 0;
    for (size_t i = 0; i < tables.size(); ++i) {
      chunks.push_back({&tables[i], start_count[i].first, start_count[i].second});
      rows += start_count[i].second;
    }
    const auto q = torch::randn({rows, H, hd}, opts);
    const double scale = 0.3;  // not 1 / sqrt(64): a scale the kernel drops would show
    for (const int64_t window : {int64_t{0}, int64_t{5}}) {
      const auto packed = pack_prefills(chunks, pt, cuda);
      const auto out = packed_prefill_attention(q, kc, vc, packed, window, scale);
      ASSERT_EQ(out.sizes(), q.sizes());
      int64_t row = 0;
      for (const auto& c : chunks) {
        const int64_t L = c.start + c.count;
        std::vector<int64_t> pages(c.pages->pages.begin(), c.pages->pages.end());
        const auto idx = torch::tensor(pages, torch::kInt64).to(cuda);
        const auto gather = [&](const torch::Tensor& cache) {  // (1, H, L, hd) fp32, heads repeated
          const auto g = cache.index_select(0, idx).permute({1, 0, 2, 3}).reshape({KV, -1, hd}).narrow(1, 0, L);
          return g.repeat_interleave(H / KV, 0).unsqueeze(0).to(torch::kFloat32);
        };
        const auto qpos = torch::arange(c.start, L, torch::TensorOptions().dtype(torch::kInt64).device(cuda));
        const auto key = torch::arange(L, qpos.options());
        auto mask = key.unsqueeze(0) <= qpos.unsqueeze(1);
        if (window > 0) mask = mask & within_window(key.unsqueeze(0), qpos.unsqueeze(1), window);
        AttentionOptions o;
        o.scale = scale;
        const auto qc = q.narrow(0, row, c.count).transpose(0, 1).unsqueeze(0).to(torch::kFloat32);
        const auto ref =
            attend(qc, gather(kc), gather(vc), mask.view({1, 1, c.count, L}), o).squeeze(0).transpose(0, 1);
        EXPECT_TRUE(test::AllClose(out.narrow(0, row, c.count).to(torch::kFloat32), ref, 0.0, 2e-2))
            << "window " << window << ", chunk at " << c.start << " of " << c.count;
        row += c.count;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
