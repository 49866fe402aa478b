// The friendly C++ API of seed 000's hybrid model (api/hybrid.h): each placement helper sets the
// keys its comment names, and the configuration it gives passes validation as `tandem train`
// would check it.

#include "tandem/api/hybrid.h"

#include <gtest/gtest.h>

#include "tandem/core/config.h"

namespace tandem {
namespace {

HybridModel small() {
  HybridModel m;
  m.dense_blocks = 2, m.moe_blocks = 2, m.width = 64, m.hidden = 128, m.experts = 4, m.vocab = 256, m.seq_len = 32;
  return m;
}

TEST(HybridApi, EachPlacementHelperSetsItsKeysAndTheConfigValidates) {
  Config c = hybrid_config(small());
  EXPECT_NO_THROW(validate_config(c));

  use_static(c, "GCCGGG");
  EXPECT_EQ(c.placement.policy, PlacementPolicyKind::kStatic);
  EXPECT_EQ(c.placement.blocks.str(), "GCCGGG");
  EXPECT_NO_THROW(validate_config(c));

  use_threshold(c, 250, 70);
  EXPECT_EQ(c.placement.policy, PlacementPolicyKind::kThreshold);
  EXPECT_DOUBLE_EQ(c.placement.threshold_w, 250);
  EXPECT_DOUBLE_EQ(c.placement.threshold_cpu_pct, 70);
  EXPECT_NO_THROW(validate_config(c));

  use_cost_model(c, 300);
  EXPECT_EQ(c.placement.policy, PlacementPolicyKind::kCost);
  EXPECT_EQ(c.placement.objective, PlacementObjective::kThroughput);
  EXPECT_DOUBLE_EQ(c.placement.gpu_power_budget_w, 300);
  EXPECT_NO_THROW(validate_config(c));

  set_movable(c, "1,2");
  EXPECT_EQ(c.placement.movable.str(), "1,2");
  EXPECT_NO_THROW(validate_config(c));
}

}  // namespace
}  // namespace tandem
