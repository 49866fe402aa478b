// Decode steps as one launch (Note [Persistent decode step]) against the layered kernels
// (TANDEM_DECODE_KERNELS=fused) on the same weights and the same steps: the logits bit for bit, at 1 to
// 4 rows, in bf16 and fp16, for grouped-query heads of 64 (groups of 2 and 8) and plain heads of 128,
// a sliding window, biases on every product with half the dimensions rotated, and sequences long
// enough that the attention splits their keys; eager and replayed from CUDA graphs. On the CPU, and
// for a model it does not take, the decoder says why and runs layer by layer.

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "../test_util.h"
#include "serve_test_util.h"
#include "tandem/core/device_graph.h"
#include "tandem/kernels/device_facts.h"
#include "tandem/serve/decode_graphs.h"
#include "tandem/serve/decoder.h"

namespace tandem {
namespace {

using StepFn = std::function<torch::Tensor(const std::vector<SequenceChunk>&)>;

// Prompts of the given lengths prefilled into `cache`, then `steps` decode steps of all of them,
// each through `decode`; the next tokens are drawn from one seed, the same in every run.
std::vector<torch::Tensor> decode_steps(Decoder& decoder, KvCache& cache, const std::vector<int64_t>& prompts,
                                        int steps, const StepFn& decode) {
  std::mt19937 rng(3);
  const int64_t V = decoder.spec().vocab_size;
  std::vector<std::vector<TokenId>> tokens(prompts.size());
  std::vector<PageTable> pages(prompts.size());
  std::vector<SequenceChunk> prefill;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int64_t t = 0; t < prompts[i]; ++t) tokens[i].push_back(static_cast<TokenId>(rng() % V));
    EXPECT_TRUE(cache.reserve(pages[i], prompts[i]));
    prefill.push_back({&pages[i], 0, tokens[i]});
  }
  decoder.forward(prefill, cache);
  std::vector<torch::Tensor> out;
  for (int step = 0; step < steps; ++step) {
    std::vector<SequenceChunk> batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      tokens[i].push_back(static_cast<TokenId>(rng() % V));
      const auto cached = static_cast<int64_t>(tokens[i].size()) - 1;
      EXPECT_TRUE(cache.reserve(pages[i], cached + 1));
      batch.push_back({&pages[i], cached, {tokens[i].back()}});
    }
    out.push_back(decode(batch).clone());
  }
  for (auto& p : pages) cache.release(p);
  return out;
}

bool persistent_gpu() { return torch::cuda::is_available() && detail::compute_capability_major() >= 9; }

// A decoder of `kernels` (TANDEM_DECODE_KERNELS) on the GPU.
std::unique_ptr<Decoder> decoder_with(const char* kernels, Model& model, torch::ScalarType dtype) {
  ::setenv("TANDEM_DECODE_KERNELS", kernels, 1);
  auto d = test::decoder_of(model, dtype, -1, 1, c10::Device(c10::kCUDA, 0));
  ::unsetenv("TANDEM_DECODE_KERNELS");
  return d;
}

// The persistent decoder's steps against the layered one's: equal, and the persistent step taken.
void expect_layered_bits(const ModelSpec& spec, torch::ScalarType dtype, const std::vector<int64_t>& prompts, int steps,
                         const std::string& what) {
  const auto model = test::random_llama(spec, 17);
  {  // biases the model has, far from zero
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : model->hf_parameters())
      if (name.find("bias") != std::string::npos) p.normal_(0.0, 0.5);
  }
  auto persistent = decoder_with("persistent", *model, dtype);
  auto layered = decoder_with("fused", *model, dtype);
  const int64_t pages = 512;
  KvCache a(persistent->cache_shape(4), pages * persistent->cache_shape(4).page_bytes());
  KvCache b(layered->cache_shape(4), pages * layered->cache_shape(4).page_bytes());
  const auto one = decode_steps(*persistent, a, prompts, steps, [&](const auto& batch) {
    EXPECT_TRUE(persistent->persistent_step(a, static_cast<int64_t>(batch.size())))
        << what << ": " << persistent->persistent_refusal();
    return persistent->forward(batch, a);
  });
  const auto two = decode_steps(*layered, b, prompts, steps, [&](const auto& batch) {
    EXPECT_FALSE(layered->persistent_step(b, static_cast<int64_t>(batch.size())));
    return layered->forward(batch, b);
  });
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i].sizes(), two[i].sizes()) << what << ", step " << i;
    EXPECT_TRUE(torch::equal(one[i], two[i]))
        << what << ", step " << i << ": largest difference " << (one[i] - two[i]).abs().max().item<double>();
  }
  // Not trivially equal: the rows and the steps differ.
  EXPECT_GT((one[0][0] - one.back()[0]).abs().max().item<double>(), 0.1) << what;
}

ModelSpec wide_spec(int64_t d_model, int64_t heads, int64_t kv_heads) {
  auto s = test::small_llama_spec();
  s.d_model = d_model, s.n_head = heads, s.n_kv_head = kv_heads, s.max_seq_len = 1024;
  return s;
}

TEST(ServePersistentStepGpu, GivesTheLayeredKernelsBitsAtEveryBatchSize) {
  if (!persistent_gpu()) GTEST_SKIP() << "no GPU of compute capability 9.0 or more";
  const auto spec = wide_spec(256, 4, 2);  // heads of 64 in groups of 2
  for (const auto dtype : {torch::kBFloat16, torch::kHalf})
    for (const auto& prompts : std::vector<std::vector<int64_t>>{{3}, {4, 7}, {1, 2, 9}, {2, 5, 9, 1}})
      expect_layered_bits(spec, dtype, prompts, 6,
                          std::string(c10::toString(dtype)) + ", " + std::to_string(prompts.size()) + " rows");
}

TEST(ServePersistentStepGpu, GivesTheLayeredKernelsBitsForEveryHeadShape) {
  if (!persistent_gpu()) GTEST_SKIP() << "no GPU of compute capability 9.0 or more";
  expect_layered_bits(wide_spec(512, 8, 1), torch::kBFloat16, {5, 2}, 5, "heads of 64 in a group of 8");
  expect_layered_bits(wide_spec(512, 4, 4), torch::kBFloat16, {5, 2, 3}, 5, "heads of 128, no groups");
  auto window = wide_spec(256, 4, 2);
  window.parts.sliding_window = 5;
  expect_layered_bits(window, torch::kBFloat16, {9, 3}, 6, "a window of 5");
  auto biased = wide_spec(256, 4, 2);
  biased.parts.qkv_bias = biased.parts.o_bias = biased.parts.mlp_bias = true;
  biased.parts.rotary_fraction = 0.5;
  expect_layered_bits(biased, torch::kBFloat16, {6, 1}, 5, "biases, half the dimensions rotated");
}

// Sequences of 600 and 700 tokens: the attention splits their keys over several items, the last of
// which combines them.
TEST(ServePersistentStepGpu, GivesTheLayeredKernelsBitsWhereTheKeysAreSplit) {
  if (!persistent_gpu()) GTEST_SKIP() << "no GPU of compute capability 9.0 or more";
  expect_layered_bits(wide_spec(256, 4, 2), torch::kBFloat16, {600, 700}, 4, "600 and 700 keys");
}

// Replayed from CUDA graphs (one cooperative launch recorded), against the layered kernels' recordings
// of the same padded steps.
TEST(ServePersistentStepGpu, RecordedStepsGiveTheLayeredRecordingsBits) {
  if (!persistent_gpu()) GTEST_SKIP() << "no GPU of compute capability 9.0 or more";
  ASSERT_NE(graph_recorder(), nullptr);
  const auto model = test::random_llama(wide_spec(256, 4, 2), 21);
  auto persistent = decoder_with("persistent", *model, torch::kBFloat16);
  auto layered = decoder_with("fused", *model, torch::kBFloat16);
  KvCache a(persistent->cache_shape(4), 128 * persistent->cache_shape(4).page_bytes());
  KvCache b(layered->cache_shape(4), 128 * layered->cache_shape(4).page_bytes());
  DecodeGraphs ga(*persistent, a, graph_recorder()), gb(*layered, b, graph_recorder());
  const std::vector<int64_t> prompts{2, 13, 5};  // padded to 4 rows
  const auto one = decode_steps(*persistent, a, prompts, 8, [&](const auto& batch) { return ga.forward(batch); });
  const auto two = decode_steps(*layered, b, prompts, 8, [&](const auto& batch) { return gb.forward(batch); });
  EXPECT_TRUE(persistent->persistent_step(a, 4)) << persistent->persistent_refusal();
  EXPECT_GE(ga.recordings(), 1);
  EXPECT_EQ(ga.replays(), 8);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(torch::equal(one[i], two[i])) << "step " << i;
}

// fp32 matrices are not the persistent step's: the decoder names why and runs layer by layer.
TEST(ServePersistentStepGpu, AModelItDoesNotTakeRunsLayerByLayerAndSaysWhy) {
  if (!persistent_gpu()) GTEST_SKIP() << "no GPU of compute capability 9.0 or more";
  const auto model = test::random_llama(wide_spec(256, 4, 2), 4);
  auto decoder = decoder_with("persistent", *model, torch::kFloat32);
  KvCache cache(decoder->cache_shape(4), 32 * decoder->cache_shape(4).page_bytes());
  decoder->prepare_decode_step(cache);
  EXPECT_FALSE(decoder->persistent_step(cache, 1));
  EXPECT_NE(decoder->persistent_refusal().find("neither bf16 nor fp16"), std::string::npos)
      << decoder->persistent_refusal();
}

// The default (TANDEM_DECODE_KERNELS unset) runs the layered kernels on any device.
TEST(ServePersistentStepGpu, TheDefaultRunsLayerByLayer) {
  if (!persistent_gpu()) GTEST_SKIP() << "no GPU of compute capability 9.0 or more";
  const auto model = test::random_llama(wide_spec(256, 4, 2), 4);
  auto decoder = test::decoder_of(*model, torch::kBFloat16, -1, 1, c10::Device(c10::kCUDA, 0));
  KvCache cache(decoder->cache_shape(4), 32 * decoder->cache_shape(4).page_bytes());
  decoder->prepare_decode_step(cache);
  EXPECT_FALSE(decoder->persistent_step(cache, 1));
}

TEST(ServePersistentStep, OnTheCpuDecodeStepsRunLayerByLayer) {
  const auto model = test::random_llama(test::small_llama_spec(), 4);
  ::setenv("TANDEM_DECODE_KERNELS", "persistent", 1);
  auto decoder = test::decoder_of(*model);
  ::unsetenv("TANDEM_DECODE_KERNELS");
  KvCache cache(decoder->cache_shape(4), 32 * decoder->cache_shape(4).page_bytes());
  decoder->prepare_decode_step(cache);
  EXPECT_FALSE(decoder->persistent_step(cache, 1));
  const auto steps =
      decode_steps(*decoder, cache, {3, 4}, 2, [&](const auto& b) { return decoder->forward(b, cache); });
  EXPECT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].size(0), 2);
}

}  // namespace
}  // namespace tandem
