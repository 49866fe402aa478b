// The first memory estimate without the offload engine (memory/estimate.h): fp32 weights, gradients and
// AdamW states; each layer's saved activations (fewer with checkpointing, one layer recomputed), the
// logits over the padded vocabulary, micro-batches in flight, and huge sizes saturated.
#include "tandem/memory/estimate.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace tandem {
namespace {

// A small Llama: head_dim 16, q width 64, k/v width 32, d_ff 128 (a multiple of 64), vocabulary
// 100 padded to 128.
ModelSpec llama() {
  ModelSpec s;
  s.name = "custom";
  s.arch = Arch::kDecoder;
  s.family = Family::kLlama;
  s.n_layer = 3;
  s.d_model = 64;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.d_ff = 128;
  s.vocab_size = 100;
  s.max_seq_len = 32;
  return s;
}

// Bytes per token of one decoder layer of llama() by its saved tensors: the residual inputs and
// normalised outputs in fp32 (4 x 4 x 64), then in the activation dtype the normalised inputs cast
// once per product and the attention output before o (6 x 64), the rotated q and k, v and the
// attention output (2 x 64 + 2 x 32) and the SwiGLU's four (4 x 128).
constexpr int64_t kFp32PerToken = 4 * 4 * 64 + 4 * (6 * 64 + 2 * 64 + 2 * 32) + 4 * 4 * 128;  // 5376
constexpr int64_t kBf16PerToken = 4 * 4 * 64 + 2 * (6 * 64 + 2 * 64 + 2 * 32) + 2 * 4 * 128;  // 3200
constexpr int64_t kTokens = 2 * 8;  // micro-batch 2, sequence 8

TEST(ActivationCost, ADecoderLayerKeepsItsSavedTensorsPerToken) {
  const ActivationCost c = activation_cost(llama(), 2, 8, Precision::kFp32, false);
  EXPECT_EQ(c.kept_per_layer, kTokens * kFp32PerToken);
  EXPECT_EQ(c.layer_working, 0) << "nothing is recomputed without checkpointing";
  // The logits in the compute dtype, their fp32 copy and its gradient, over the padded vocabulary.
  EXPECT_EQ(c.logits, kTokens * 128 * (4 + 4 + 4));
}

TEST(ActivationCost, HalfPrecisionHalvesTheActivationsButNotTheFp32Parts) {
  const ActivationCost c = activation_cost(llama(), 2, 8, Precision::kBf16, false);
  EXPECT_EQ(c.kept_per_layer, kTokens * kBf16PerToken);
  EXPECT_EQ(c.logits, kTokens * 128 * (2 + 4 + 4));
  const ActivationCost h = activation_cost(llama(), 2, 8, Precision::kFp16, false);
  EXPECT_EQ(h.kept_per_layer, c.kept_per_layer) << "fp16 and bf16 elements are both 2 bytes";
}

TEST(ActivationCost, CheckpointingKeepsOnlyEachLayersInputAndRecomputesOneLayer) {
  const ActivationCost c = activation_cost(llama(), 2, 8, Precision::kFp32, true);
  EXPECT_EQ(c.kept_per_layer, kTokens * 64 * 4) << "the layer's fp32 input";
  EXPECT_EQ(c.layer_working, kTokens * kFp32PerToken) << "one layer's saved tensors while it is recomputed";
  EXPECT_EQ(c.activations(3, 1), 3 * kTokens * 64 * 4 + kTokens * kFp32PerToken);
  EXPECT_EQ(c.logits, activation_cost(llama(), 2, 8, Precision::kFp32, false).logits)
      << "checkpointing leaves the logits";
}

TEST(ActivationCost, MicroBatchesInFlightMultiplyTheKeptLayers) {
  const ActivationCost c = activation_cost(llama(), 2, 8, Precision::kFp32, false);
  EXPECT_EQ(c.activations(2, 3), 6 * kTokens * kFp32PerToken);
  EXPECT_EQ(c.activations(0, 5), 0);
  const ActivationCost k = activation_cost(llama(), 2, 8, Precision::kFp32, true);
  EXPECT_EQ(k.activations(2, 3), 6 * kTokens * 64 * 4 + k.layer_working) << "one layer recomputed at a time";
}

TEST(ActivationCost, SoftCappedAttentionAlsoKeepsItsScores) {
  ModelSpec s = llama();
  s.parts.attn_softcap = 50;
  const ActivationCost c = activation_cost(s, 2, 8, Precision::kFp32, false);
  // Per token and head: T scores before and after the cap (compute dtype) and the fp32 softmax.
  EXPECT_EQ(c.kept_per_layer, kTokens * (kFp32PerToken + 4 * 8 * (2 * 4 + 4)));
  const ActivationCost longer = activation_cost(s, 1, 16, Precision::kFp32, false);
  EXPECT_GT(longer.kept_per_layer, c.kept_per_layer) << "the same tokens in longer rows keep more scores";
}

TEST(ActivationCost, GroupedQueryAttentionCountsTheKeyValueHeads) {
  ModelSpec s = llama();
  s.n_kv_head = 4;  // k/v as wide as q
  const ActivationCost c = activation_cost(s, 2, 8, Precision::kFp32, false);
  EXPECT_EQ(c.kept_per_layer - activation_cost(llama(), 2, 8, Precision::kFp32, false).kept_per_layer,
            kTokens * 4 * 2 * 32)
      << "the rotated k and v, 32 elements wider each";
}

TEST(ActivationCost, AnMlpCountsItsPaddedHiddenWidth) {
  ModelSpec s = llama();
  s.arch = Arch::kMlp;
  s.d_ff = 100;  // stored padded to 128
  const ActivationCost c = activation_cost(s, 2, 8, Precision::kFp32, false);
  EXPECT_EQ(c.kept_per_layer, kTokens * (4 * 64 + 4 * (64 + 2 * 128)));
}

TEST(ActivationCost, AResNetBkCountsItsSweepsAndExperts) {
  ModelSpec s = llama();
  s.arch = Arch::kResNetBk;
  s.d_ff = 32;
  s.n_experts = 4;
  s.top_k = 2;
  const ActivationCost c = activation_cost(s, 2, 8, Precision::kFp32, false);
  // Norms and projections, per head the fp32 sweeps (a, b, c), complex r, s, G and two more, and
  // top_k experts' inputs and SwiGLU intermediates.
  EXPECT_EQ(c.kept_per_layer,
            kTokens * (2 * 4 * 64 + 4 * 2 * 64 + 4 * (3 * 4 + 3 * 8 + 2 * 4) + 2 * 4 * (64 + 4 * 32)));
}

TEST(MemoryEstimate, WeightsGradientsAndStatesFollowTheParameterCount) {
  const ModelSpec s = llama();
  const int64_t n = s.num_params();
  const MemoryEstimate e = estimate_training_memory(s, 2, 8, Precision::kBf16, false);
  EXPECT_EQ(e.weights, 4 * n) << "fp32 weights whatever the autocast dtype";
  EXPECT_EQ(e.grads, 4 * n);
  EXPECT_EQ(e.optimizer, 8 * n) << "AdamW's m and v in fp32";
  const ActivationCost c = activation_cost(s, 2, 8, Precision::kBf16, false);
  EXPECT_EQ(e.activations, c.activations(s.n_layer, 1)) << "every layer of one micro-batch";
  EXPECT_EQ(e.activations, 3 * kTokens * kBf16PerToken);
  EXPECT_EQ(e.logits, c.logits);
  EXPECT_EQ(e.total(), 16 * n + e.activations + e.logits);
}

TEST(MemoryEstimate, CheckpointingShrinksOnlyTheActivations) {
  const ModelSpec s = llama();
  const MemoryEstimate plain = estimate_training_memory(s, 4, 32, Precision::kFp32, false);
  const MemoryEstimate kept = estimate_training_memory(s, 4, 32, Precision::kFp32, true);
  EXPECT_EQ(kept.weights + kept.grads + kept.optimizer, plain.weights + plain.grads + plain.optimizer);
  EXPECT_EQ(kept.logits, plain.logits);
  EXPECT_EQ(kept.activations, 3 * 4 * 32 * 64 * 4 + 4 * 32 * kFp32PerToken);
  EXPECT_LT(kept.activations, plain.activations);
}

TEST(MemoryEstimate, RowsNameEachPartInOrderAndSumToTheTotal) {
  const MemoryEstimate e = estimate_training_memory(llama(), 2, 8, Precision::kFp32, false);
  const auto rows = e.rows();
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0], std::make_pair(std::string("weights (fp32)"), e.weights));
  EXPECT_EQ(rows[1], std::make_pair(std::string("gradients (fp32)"), e.grads));
  EXPECT_EQ(rows[2], std::make_pair(std::string("AdamW states (fp32 m, v)"), e.optimizer));
  EXPECT_EQ(rows[3], std::make_pair(std::string("activations"), e.activations));
  EXPECT_EQ(rows[4], std::make_pair(std::string("logits and loss"), e.logits));
  int64_t sum = 0;
  for (const auto& [name, bytes] : rows) sum += bytes;
  EXPECT_EQ(sum, e.total());
}

TEST(MemoryEstimate, HugeSizesSaturateAtTwoToTheSixtyEach) {
  constexpr int64_t kCap = int64_t{1} << 60;
  const ActivationCost c = activation_cost(llama(), int64_t{1} << 40, int64_t{1} << 24, Precision::kFp32, false);
  EXPECT_EQ(c.kept_per_layer, kCap);
  EXPECT_EQ(c.logits, kCap);
  EXPECT_EQ(c.activations(1 << 14, 1 << 10), kCap) << "the layers' product saturates too";
  const MemoryEstimate e =
      estimate_training_memory(llama(), int64_t{1} << 40, int64_t{1} << 24, Precision::kFp32, true);
  EXPECT_EQ(e.activations, kCap);
  EXPECT_GT(e.total(), 0) << "the sum stays within int64";
  EXPECT_GE(e.total(), 2 * kCap);
}

}  // namespace
}  // namespace tandem
