// A user's module as a Block sequence (python/module_blocks.h): its Blocks in order with their
// sizes, narrower float parameters widened in place, the forward hooks' calls; and each way a
// grouping can be wrong refused with its fix.
#include "tandem/python/module_blocks.h"

#include <gtest/gtest.h>

#include "../test_util.h"

namespace tandem {
namespace {

TEST(ModuleBlocks, BlocksKeepTheirOrderNamesKindsAndSizes) {
  const torch::Tensor e = torch::zeros({10, 4}), a = torch::zeros({4, 4}), b = torch::zeros({4}),
                      h = torch::zeros({4, 10});
  ModuleBlocks m({{"embed", BlockKind::kEmbedding, {{"emb", e}}},
                  {"layer.0", BlockKind::kLayer, {{"l0.w", a}, {"l0.b", b}}},
                  {"head", BlockKind::kHead, {{"out", h}}}});
  ASSERT_EQ(m.block_count(), 3u);
  EXPECT_EQ(m.block_name(1), "layer.0");
  EXPECT_EQ(m.block_kind(0), BlockKind::kEmbedding);
  EXPECT_EQ(m.block_kind(2), BlockKind::kHead);
  EXPECT_EQ(m.block_numel(1), 20);
  EXPECT_EQ(m.numel(), 40 + 20 + 40);
  const auto all = m.all_parameters();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].first, "emb");
  EXPECT_EQ(all[2].first, "l0.b");
  EXPECT_TRUE(all[2].second.is_same(b)) << "the module's own tensors, not copies";
}

TEST(ModuleBlocks, NarrowerFloatParametersAreWidenedInPlace) {
  torch::Tensor p = torch::full({3}, 1.5, torch::kBFloat16);
  const void* impl = p.unsafeGetTensorImpl();
  ModuleBlocks m({{"layer.0", BlockKind::kLayer, {{"w", p}}}});
  EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  EXPECT_EQ(p.unsafeGetTensorImpl(), impl) << "the same parameter object the module holds";
  EXPECT_EQ(p[0].item<float>(), 1.5f);
}

TEST(ModuleBlocks, TheHooksCallsReachTheEngineAndHostBlocksAreMarked) {
  ModuleBlocks m({{"a", BlockKind::kLayer, {{"w", torch::zeros({2})}}},
                  {"b", BlockKind::kLayer, {{"v", torch::zeros({2})}}}});
  m.before_block(0);  // no engine yet: nothing happens
  std::vector<size_t> seen;
  m.set_before_block([&](size_t i) { seen.push_back(i); });
  m.before_block(1);
  m.before_block(0);
  EXPECT_EQ(seen, (std::vector<size_t>{1, 0}));
  EXPECT_FALSE(m.host_block(1)) << "on the device until a placement says otherwise";
  m.set_host_blocks({false, true});
  EXPECT_TRUE(m.host_block(1));
  EXPECT_FALSE(m.host_block(0));
  EXPECT_FALSE(m.host_block(7)) << "past the placement: on the device";
}

TEST(ModuleBlocks, EachWrongGroupingIsRefusedWithItsFix) {
  const torch::Tensor w = torch::zeros({2});
  std::string err = test::error_of([] { ModuleBlocks m({}); });
  EXPECT_NE(err.find("the model has no Blocks"), std::string::npos) << err;
  err = test::error_of([] { ModuleBlocks m({{"empty", BlockKind::kLayer, {}}}); });
  EXPECT_NE(err.find("Block 'empty' has no parameters"), std::string::npos) << err;
  err = test::error_of([&] {
    ModuleBlocks m({{"a", BlockKind::kLayer, {{"w", w}}}, {"b", BlockKind::kLayer, {{"tied", w}}}});
  });
  EXPECT_NE(err.find("'w' in Block 'a' and 'tied' in Block 'b'"), std::string::npos) << err;
  EXPECT_NE(err.find("a tied weight belongs to one Block only"), std::string::npos) << err;
  err = test::error_of([] {
    ModuleBlocks m({{"a", BlockKind::kLayer, {{"w", torch::zeros({2})}}},
                    {"b", BlockKind::kLayer, {{"w", torch::zeros({2})}}}});
  });
  EXPECT_NE(err.find("two parameters are named 'w'"), std::string::npos) << err;
  err = test::error_of([] { ModuleBlocks m({{"a", BlockKind::kLayer, {{"ids", torch::zeros({2}, torch::kLong)}}}}); });
  EXPECT_NE(err.find("floating-point parameters only"), std::string::npos) << err;
  err = test::error_of([] { ModuleBlocks m({{"a", BlockKind::kLayer, {{"u", torch::Tensor()}}}}); });
  EXPECT_NE(err.find("parameter 'u' is undefined"), std::string::npos) << err;
}

}  // namespace
}  // namespace tandem
