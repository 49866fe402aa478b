// Decode steps through DecodeGraphs (Note [Decode graphs]) against Decoder::forward on the
// same weights: the padded step (batch and page tables padded, padded rows in the scratch page)
// gives the eager step's logits for batches that cross buckets and sequences that cross pages; a
// recorder is asked once per shape, each recording after the first in the first's memory pool, and
// the recordings replayed; a recording that fails turns
// recording off and the step still returns the eager logits. On a GPU: CUDA graphs replayed.

#include "tandem/serve/decode_graphs.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "../test_util.h"
#include "serve_test_util.h"

namespace tandem {
namespace {

// A recorder that "records" by keeping the work and replays by running it again: the protocol of
// Note [Recorded device work] on the CPU. `fail` makes record() throw, as a CUDA capture does for
// work that waits on the device.
class RerunRecorder : public GraphRecorder {
 public:
  bool fail = false;
  int records = 0;
  std::vector<const DeviceGraph*> shared;  // each record()'s share_memory_with
  std::unique_ptr<DeviceGraph> record(int, const std::function<void()>& work,
                                      const DeviceGraph* share_memory_with) override {
    if (fail) throw std::runtime_error("operation not permitted when stream is capturing");
    ++records;
    shared.push_back(share_memory_with);
    work();
    struct Rerun : DeviceGraph {
      std::function<void()> work;
      void replay() override { work(); }
    };
    auto g = std::make_unique<Rerun>();
    g->work = work;
    return g;
  }
};

struct Seq {
  std::vector<TokenId> tokens;
  PageTable pages;
  int64_t cached = 0;
};

// Sequences of the given prompt lengths, prefilled eagerly into `cache`, then `steps` decode steps
// each through `decode` (the step's logits (B, V)); the next token of each is drawn from `rng`, the
// same on every run. Returns each step's logits.
std::vector<torch::Tensor> decode_run(Decoder& decoder, KvCache& cache, const std::vector<int64_t>& prompts, int steps,
                                      const std::function<torch::Tensor(const std::vector<SequenceChunk>&)>& decode) {
  std::mt19937 rng(5);
  const int64_t V = decoder.spec().vocab_size;
  std::vector<Seq> seqs(prompts.size());
  std::vector<SequenceChunk> prefill;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int64_t t = 0; t < prompts[i]; ++t) seqs[i].tokens.push_back(static_cast<TokenId>(rng() % V));
    EXPECT_TRUE(cache.reserve(seqs[i].pages, prompts[i]));
    prefill.push_back({&seqs[i].pages, 0, seqs[i].tokens});
  }
  decoder.forward(prefill, cache);
  std::vector<torch::Tensor> out;
  for (auto& s : seqs)
    s.cached = static_cast<int64_t>(s.tokens.size()), s.tokens.push_back(static_cast<TokenId>(rng() % V));
  for (int step = 0; step < steps; ++step) {
    std::vector<SequenceChunk> batch;
    for (auto& s : seqs) {
      EXPECT_TRUE(cache.reserve(s.pages, s.cached + 1));
      batch.push_back({&s.pages, s.cached, {s.tokens.back()}});
    }
    out.push_back(decode(batch).clone());
    for (auto& s : seqs) ++s.cached, s.tokens.push_back(static_cast<TokenId>(rng() % V));
  }
  for (auto& s : seqs) cache.release(s.pages);
  return out;
}

void expect_same_steps(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << "step " << i;
    EXPECT_TRUE(test::AllClose(a[i], b[i], tol, tol)) << "step " << i;
  }
}

TEST(ServeDecodeGraphs, BucketsCoverEveryBatchAndTable) {
  EXPECT_EQ(DecodeGraphs::batch_bucket(1), 1);
  EXPECT_EQ(DecodeGraphs::batch_bucket(3), 4);
  EXPECT_EQ(DecodeGraphs::batch_bucket(8), 8);
  EXPECT_EQ(DecodeGraphs::batch_bucket(9), 16);
  EXPECT_EQ(DecodeGraphs::batch_bucket(17), 24);
  EXPECT_EQ(DecodeGraphs::batch_bucket(64), 64);
  EXPECT_EQ(DecodeGraphs::pages_bucket(1, 24), 1);
  EXPECT_EQ(DecodeGraphs::pages_bucket(5, 24), 8);
  EXPECT_EQ(DecodeGraphs::pages_bucket(17, 24), 24);  // at most the context's pages
}

// Batches of 3 and 9 sequences (buckets 4 and 16), prompts from 1 to 14 tokens on pages of 4, over
// 10 steps: tables grow from 1 to 6 pages (buckets 1, 2, 4, 8).
TEST(ServeDecodeGraphs, PaddedStepsEqualTheEagerDecoder) {
  const auto model = test::random_llama(test::small_llama_spec(), 21);
  auto decoder = test::decoder_of(*model);
  for (const std::vector<int64_t>& prompts :
       {std::vector<int64_t>{3, 14, 1}, std::vector<int64_t>{2, 5, 9, 1, 4, 13, 7, 3, 8}}) {
    KvCache eager_cache(decoder->cache_shape(4), 64 * decoder->cache_shape(4).page_bytes());
    KvCache padded_cache(decoder->cache_shape(4), 64 * decoder->cache_shape(4).page_bytes());
    const auto eager = decode_run(*decoder, eager_cache, prompts, 10,
                                  [&](const auto& batch) { return decoder->forward(batch, eager_cache); });
    DecodeGraphs graphs(*decoder, padded_cache, nullptr);
    const auto padded = decode_run(*decoder, padded_cache, prompts, 10, [&](const auto& batch) {
      EXPECT_TRUE(graphs.takes(batch));
      return graphs.forward(batch);
    });
    expect_same_steps(eager, padded, 2e-5);
    // Not trivially equal: the sequences' logits differ.
    EXPECT_GT((eager[0][0] - eager[0][1]).abs().max().item<double>(), 1.0);
  }
}

TEST(ServeDecodeGraphs, RecordsOncePerShapeAndReplays) {
  const auto model = test::random_llama(test::small_llama_spec(), 22);
  auto decoder = test::decoder_of(*model);
  KvCache eager_cache(decoder->cache_shape(4), 64 * decoder->cache_shape(4).page_bytes());
  KvCache recorded_cache(decoder->cache_shape(4), 64 * decoder->cache_shape(4).page_bytes());
  const std::vector<int64_t> prompts{3, 6, 2};
  const auto eager = decode_run(*decoder, eager_cache, prompts, 8,
                                [&](const auto& batch) { return decoder->forward(batch, eager_cache); });
  RerunRecorder recorder;
  DecodeGraphs graphs(*decoder, recorded_cache, &recorder);
  const auto replayed =
      decode_run(*decoder, recorded_cache, prompts, 8, [&](const auto& batch) { return graphs.forward(batch); });
  expect_same_steps(eager, replayed, 2e-5);
  // Tables of 1..4 pages over the 8 steps (longest: 6 + 8 tokens): page buckets 2 and 4, batch 4.
  EXPECT_EQ(recorder.records, 2);
  ASSERT_EQ(recorder.shared.size(), 2u);  // the first recording's pool, shared by the second
  EXPECT_EQ(recorder.shared[0], nullptr);
  EXPECT_NE(recorder.shared[1], nullptr);
  EXPECT_EQ(graphs.recordings(), 2);
  EXPECT_EQ(graphs.replays(), 8);
  // A prefill is not a decode step.
  PageTable t;
  ASSERT_TRUE(recorded_cache.reserve(t, 2));
  EXPECT_FALSE(graphs.takes({{&t, 0, {1, 2}}}));
  recorded_cache.release(t);
}

TEST(ServeDecodeGraphs, AFailedRecordingFallsBackToTheEagerStep) {
  const auto model = test::random_llama(test::small_llama_spec(), 23);
  auto decoder = test::decoder_of(*model);
  KvCache eager_cache(decoder->cache_shape(4), 64 * decoder->cache_shape(4).page_bytes());
  KvCache cache(decoder->cache_shape(4), 64 * decoder->cache_shape(4).page_bytes());
  const std::vector<int64_t> prompts{4, 1};
  const auto eager = decode_run(*decoder, eager_cache, prompts, 3,
                                [&](const auto& batch) { return decoder->forward(batch, eager_cache); });
  RerunRecorder recorder;
  recorder.fail = true;
  DecodeGraphs graphs(*decoder, cache, &recorder);
  int through_graphs = 0;
  const auto fallen = decode_run(*decoder, cache, prompts, 3, [&](const auto& batch) {
    if (!graphs.takes(batch)) return decoder->forward(batch, cache);
    ++through_graphs;
    return graphs.forward(batch);
  });
  expect_same_steps(eager, fallen, 2e-5);
  EXPECT_EQ(through_graphs, 1);  // the first step tried, failed, ran eagerly; the others did not try
  EXPECT_EQ(graphs.recordings(), 0);
}

// CUDA graphs on the GPU: fp32 and bf16, replayed steps against the eager decoder on the same GPU,
// with heads of 8 (the gathered pages) and of 64 (the paged kernel, Note [Paged decode attention]).
TEST(ServeDecodeGraphsGpu, CudaGraphsEqualTheEagerDecoder) {
  REQUIRE_CUDA();
  ASSERT_NE(graph_recorder(), nullptr);
  auto wide = test::small_llama_spec();
  wide.d_model = 256, wide.n_head = 4, wide.n_kv_head = 2;
  for (const auto& spec : {test::small_llama_spec(), wide})
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const auto model = test::random_llama(spec, 24);
      auto decoder = test::decoder_of(*model, dtype, -1, 1, c10::Device(c10::kCUDA, 0));
      EXPECT_EQ(decoder->paged_attention(), spec.head_dim() == 64);
      KvCache eager_cache(decoder->cache_shape(4), 64 * decoder->cache_shape(4).page_bytes());
      KvCache cache(decoder->cache_shape(4), 64 * decoder->cache_shape(4).page_bytes());
      const std::vector<int64_t> prompts{2, 5, 9, 1, 4, 13, 7, 3, 8};
      const auto eager = decode_run(*decoder, eager_cache, prompts, 12,
                                    [&](const auto& batch) { return decoder->forward(batch, eager_cache); });
      DecodeGraphs graphs(*decoder, cache, graph_recorder());
      const auto replayed =
          decode_run(*decoder, cache, prompts, 12, [&](const auto& batch) { return graphs.forward(batch); });
      const double scale = eager[0].abs().max().item<double>();
      expect_same_steps(eager, replayed, dtype == torch::kFloat32 ? 1e-4 : 0.02 * scale);
      EXPECT_GE(graphs.recordings(), 2);
      EXPECT_EQ(graphs.replays(), 12);
    }
}

}  // namespace
}  // namespace tandem
