// model.activation_offload=auto (Note [Automatic activation offload]): the key, the rule's cases
// and bounds, the host's cap, and the host fit counting the offloaded bytes.

#include "tandem/memory/activation_choice.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "tandem/memory/estimate.h"
#include "tandem/memory/host_fit.h"
#include "tandem/memory/plan.h"

namespace tandem {
namespace {

using test::error_of;

Config checkpointed(int64_t micro_batch) {
  Config c;
  c.model.checkpointing = true;
  c.train.micro_batch = micro_batch;
  c.train.precision = Precision::kBf16;
  return c;
}

// An H200's rates: the 13B layer's up product and pinned copies (PERF.md: 55 GB/s one way).
constexpr ActivationRates kH200{650e12, 55e9};

TEST(ActivationChoice, AutoIsAKeyThatReadsBackAsWritten) {
  Config c;
  set_config_key(c, "model.activation_offload", "auto");
  EXPECT_EQ(c.model.activation_offload, ModelConfig::kAutoActivationOffload);
  EXPECT_EQ(get_config_key(c, "model.activation_offload"), "auto");
  EXPECT_NO_THROW(validate_config(c));
  set_config_key(c, "model.activation_offload", "12");
  EXPECT_EQ(get_config_key(c, "model.activation_offload"), "12");
  c.model.activation_offload = -3;
  EXPECT_NE(error_of([&] { validate_config(c); }).find("must be auto, -1"), std::string::npos);
  EXPECT_NE(error_of([&] { set_config_key(c, "model.activation_offload", "most"); }).find("expects an integer"),
            std::string::npos);
}

TEST(ActivationChoice, NoneWhereTheLinkHasNoRoomOrNothingIsRecomputed) {
  const ModelSpec s = preset_spec("13B");
  Config kept = checkpointed(4);
  kept.model.checkpointing = false;
  EXPECT_EQ(choose_offloaded_layers(s, kept, 2048, kH200, -1).layers, 0);
  EXPECT_NE(choose_offloaded_layers(s, kept, 2048, kH200, -1).why.find("checkpointing is off"), std::string::npos);
  Config engine = checkpointed(4);
  engine.offload.optimizer = OffloadTarget::kCpu;
  EXPECT_EQ(choose_offloaded_layers(s, engine, 2048, kH200, -1).layers, 0);
  EXPECT_NE(activation_offload_excluded(engine).find("offload engine"), std::string::npos);
  Config piped = checkpointed(4);
  piped.dist.pipeline_stages = "2";
  EXPECT_EQ(choose_offloaded_layers(s, piped, 2048, kH200, -1).layers, 0);
  EXPECT_EQ(activation_offload_excluded(checkpointed(4)), "");
}

TEST(ActivationChoice, TheRuleHidesTheCopiesUnderTheRecomputedLayers) {
  const ModelSpec s = preset_spec("13B");
  const Config c = checkpointed(4);
  const ActivationChoice h200 = choose_offloaded_layers(s, c, 2048, kH200, -1);
  // 16 of 40 layers measured faster than recomputing all (docs/benchmarks.md); the rule's f is short.
  EXPECT_GE(h200.layers, 16) << h200.why;
  EXPECT_LT(h200.layers, s.n_layer) << h200.why;
  EXPECT_NE(h200.why.find("GB/s"), std::string::npos);
  // A slower link hides fewer layers, a slower device more; an endless link all of them.
  EXPECT_LT(choose_offloaded_layers(s, c, 2048, {650e12, 25e9}, -1).layers, h200.layers);
  EXPECT_GT(choose_offloaded_layers(s, c, 2048, {300e12, 55e9}, -1).layers, h200.layers);
  EXPECT_EQ(choose_offloaded_layers(s, c, 2048, {650e12, 1e18}, -1).layers, s.n_layer);
  // The bound itself: N c <= 3 f (L - N) + 2 f N holds at the count and fails one past it.
  const double bytes = double(activation_cost(s, 4, 2048, Precision::kBf16, false).kept_per_layer);
  const double tok = 4.0 * 2048;
  const double f = (2.0 * double(s.layer_params(0)) * tok + 2.0 * tok * 2048 * double(s.d_model)) / kH200.flops_per_s;
  const double cc = bytes / kH200.link_bytes_per_s;
  const auto hidden = [&](double n) { return n * cc <= 3 * f * (double(s.n_layer) - n) + 2 * f * n; };
  EXPECT_TRUE(hidden(double(h200.layers)));
  EXPECT_FALSE(hidden(double(h200.layers + 1)));
}

TEST(ActivationChoice, TheHostsRoomCapsTheCount) {
  const ModelSpec s = preset_spec("13B");
  const Config c = checkpointed(4);
  const int64_t bytes = activation_cost(s, 4, 2048, Precision::kBf16, false).kept_per_layer;
  const ActivationChoice capped = choose_offloaded_layers(s, c, 2048, kH200, 5 * bytes + bytes / 2);
  EXPECT_EQ(capped.layers, 5);
  EXPECT_NE(capped.why.find("host memory left"), std::string::npos) << capped.why;
  EXPECT_EQ(choose_offloaded_layers(s, c, 2048, kH200, 0).layers, 0);
}

TEST(ActivationChoice, OnTheCpuAutoIsNone) {
  Config c = checkpointed(2);
  c.model.activation_offload = ModelConfig::kAutoActivationOffload;
  const Config r = resolve_activation_offload(c, preset_spec("tiny"), 64, torch::kCPU, -1);
  EXPECT_EQ(r.model.activation_offload, 0);
  c.model.activation_offload = 3;
  EXPECT_EQ(resolve_activation_offload(c, preset_spec("tiny"), 64, torch::kCPU, -1).model.activation_offload, 3);
}

TEST(ActivationChoice, TheHostFitCountsTheOffloadedLayers) {
  const ModelSpec s = preset_spec("13B");
  Config c = checkpointed(4);
  const int64_t without = host_demand(s, c, 2048, false).total();
  c.model.activation_offload = 8;
  const int64_t with = host_demand(s, c, 2048, false).total();
  EXPECT_EQ(with - without, offloaded_activation_bytes(s, c, 2048));
  EXPECT_EQ(with - without, 8 * activation_cost(s, 4, 2048, Precision::kBf16, false).kept_per_layer);
}

}  // namespace
}  // namespace tandem
