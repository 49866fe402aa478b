// Residency plans (serve/residency_plan.h): layer and fixed sizes per family, the first layers kept
// within the budget with prefetch + 1 slots for the rest, the summary line, impossible budgets refused.

#include "tandem/serve/residency_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../error_of.h"
#include "tandem/models/family.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

using test::error_of;

// 6 Llama layers of d_model 8, 2 heads of 4 (1 key/value head), feed-forward 12 (stored padded to
// 64, read unpadded), vocabulary 10, untied: 496 elements a layer, 168 fixed.
ModelSpec llama_spec() {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 6, s.d_model = 8, s.n_head = 2, s.n_kv_head = 1, s.d_ff = 12;
  s.vocab_size = 10, s.max_seq_len = 16, s.tie_embeddings = false;
  return s;
}

ModelSpec family_spec(Family family) {
  ModelSpec s = llama_spec();
  s.family = family;
  s.parts = family_parts(family);
  return s;
}

constexpr int64_t kLayer = 496 * 4, kFixed = 168 * 4;  // fp32 bytes

TEST(ResidencyPlan, ALayersAndTheFixedWeightsElementsFollowTheFamily) {
  // Llama: q and o 8x8, k and v 8x4, gate, up and down 8x12, two RMSNorms of 8.
  EXPECT_EQ(decoder_layer_numel(llama_spec()), 2 * 64 + 2 * 32 + 3 * 96 + 2 * 8);
  // The embedding and the untied head 10x8, the final norm 8; tied, the head is the embedding.
  EXPECT_EQ(decoder_fixed_numel(llama_spec()), 80 + 8 + 80);
  ModelSpec tied = llama_spec();
  tied.tie_embeddings = true;
  EXPECT_EQ(decoder_fixed_numel(tied), 80 + 8);
  // GPT-2: as many key/value heads as heads, q/k/v and output biases, an ungated feed-forward with
  // biases, LayerNorms with biases, a learned position table of 16 x 8, tied.
  ModelSpec gpt2 = family_spec(Family::kGpt2);
  gpt2.n_kv_head = 2;
  gpt2.tie_embeddings = true;
  EXPECT_EQ(decoder_layer_numel(gpt2), 4 * 64 + (24 + 8) + 2 * 96 + (12 + 8) + 2 * 16);
  EXPECT_EQ(decoder_fixed_numel(gpt2), 80 + 16 * 8 + 16);
  // Gemma2: four norms a layer.
  EXPECT_EQ(decoder_layer_numel(family_spec(Family::kGemma2)), 2 * 64 + 2 * 32 + 3 * 96 + 4 * 8);
}

TEST(ResidencyPlan, WithoutALimitOrWithinTheBudgetEveryLayerIsResident) {
  for (const int64_t budget : {int64_t{-1}, kFixed + 6 * kLayer}) {
    SCOPED_TRACE(budget);
    const auto plan = plan_residency(llama_spec(), torch::kFloat32, budget, 2);
    EXPECT_EQ(plan.layers, std::vector<LayerHome>(6, LayerHome::kDevice));
    EXPECT_EQ(plan.slots, 0);
    EXPECT_EQ(plan.layer_bytes, kLayer);
    EXPECT_EQ(plan.fixed_bytes, kFixed);
    EXPECT_EQ(plan.streamed(), 0);
    EXPECT_EQ(plan.resident(), 6);
    EXPECT_EQ(plan.device_bytes(), kFixed + 6 * kLayer);
    EXPECT_EQ(plan.host_bytes(), 0);
    EXPECT_EQ(plan.describe(), "all 6 layers resident (12.28 KiB of weights on the device)");
  }
  // The bytes follow the dtype.
  const auto bf16 = plan_residency(llama_spec(), torch::kBFloat16, -1, 1);
  EXPECT_EQ(bf16.layer_bytes, kLayer / 2);
  EXPECT_EQ(bf16.fixed_bytes, kFixed / 2);
}

// One byte short of every layer: the first layers that fit beside the fixed weights and the slots
// stay, the rest pass through prefetch + 1 slots.
TEST(ResidencyPlan, TheFirstLayersThatFitStayAndTheRestStreamThroughTheSlots) {
  const int64_t budget = kFixed + 4 * kLayer + 100;  // 2 slots + 2 layers, not 5 layers
  const auto plan = plan_residency(llama_spec(), torch::kFloat32, budget, /*prefetch_layers=*/1);
  const auto D = LayerHome::kDevice, H = LayerHome::kHost;
  EXPECT_EQ(plan.layers, (std::vector<LayerHome>{D, D, H, H, H, H}));
  EXPECT_EQ(plan.slots, 2);
  EXPECT_EQ(plan.resident(), 2);
  EXPECT_EQ(plan.streamed(), 4);
  EXPECT_EQ(plan.device_bytes(), kFixed + 4 * kLayer);
  EXPECT_LE(plan.device_bytes(), budget);
  EXPECT_EQ(plan.host_bytes(), 4 * kLayer);
  EXPECT_EQ(plan.describe(),
            "2 of 6 layers resident, 4 streamed from pinned host memory (7.75 KiB) through 2 device buffers; "
            "8.41 KiB of weights on the device");
  // More prefetch: a slot more, a resident layer fewer.
  const auto deeper = plan_residency(llama_spec(), torch::kFloat32, budget, 2);
  EXPECT_EQ(deeper.slots, 3);
  EXPECT_EQ(deeper.layers, (std::vector<LayerHome>{D, H, H, H, H, H}));
  // A byte below every layer resident: streaming begins.
  const auto short_one = plan_residency(llama_spec(), torch::kFloat32, kFixed + 6 * kLayer - 1, 1);
  EXPECT_EQ(short_one.slots, 2);
  EXPECT_EQ(short_one.resident(), 3);
  EXPECT_EQ(short_one.streamed(), 3);
}

TEST(ResidencyPlan, ABudgetWithoutRoomForTheFixedWeightsAndTheSlotsIsRefusedWithTheNumbers) {
  const std::string zero = error_of([] { plan_residency(llama_spec(), torch::kFloat32, 0, 1); });
  EXPECT_NE(zero.find("the device's weight budget of 0 B does not hold the embedding and output projection (672 B) "
                      "and 2 layer buffers for streaming (1.94 KiB each)"),
            std::string::npos)
      << zero;
  EXPECT_NE(zero.find("--gpu-memory-gib"), std::string::npos) << zero;
  // The slots are at most the layers: prefetch 4 asks for 5, a model of 2 layers gets 2.
  ModelSpec two = llama_spec();
  two.n_layer = 2;
  const std::string capped =
      error_of([&] { plan_residency(two, torch::kFloat32, kFixed + 2 * kLayer - 1, /*prefetch_layers=*/4); });
  EXPECT_NE(capped.find("and 2 layer buffers for streaming"), std::string::npos) << capped;
  // Exactly the fixed weights and the slots: nothing resident, every layer streamed.
  const auto tight = plan_residency(llama_spec(), torch::kFloat32, kFixed + 2 * kLayer, 1);
  EXPECT_EQ(tight.resident(), 0);
  EXPECT_EQ(tight.streamed(), 6);
  EXPECT_NE(error_of([] { plan_residency(llama_spec(), torch::kFloat32, kFixed + 2 * kLayer - 1, 1); }), "");
}

TEST(ResidencyPlan, FewerThanOnePrefetchedLayerIsRefusedEvenWithoutALimit) {
  for (const int64_t prefetch : {0, -2}) {
    const std::string e = error_of([&] { plan_residency(llama_spec(), torch::kFloat32, -1, prefetch); });
    EXPECT_NE(e.find("--prefetch-layers must be at least 1; got " + std::to_string(prefetch)), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace tandem
