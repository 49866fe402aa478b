// The offload plan of a user's module (python/module_plan.h, Note [Module plan]) on the CPU: the
// host's floor refused with the numbers' fix, the ring taken when per-Block buffers do not fit,
// the solver's lower bound, and the update split of a given k counted in decoder layers.
#include "tandem/python/module_plan.h"

#include <gtest/gtest.h>

#include "../test_util.h"

namespace tandem {
namespace {

// An embedding, four layers and a head, each of `n` fp32 parameters.
ModuleBlocks six_blocks(int64_t n) {
  std::vector<BlockGroup> g;
  g.push_back({"embed", BlockKind::kEmbedding, {{"e", torch::zeros({n})}}});
  for (int i = 0; i < 4; ++i)
    g.push_back({"layer." + std::to_string(i), BlockKind::kLayer, {{"l" + std::to_string(i), torch::zeros({n})}}});
  g.push_back({"head", BlockKind::kHead, {{"h", torch::zeros({n})}}});
  return ModuleBlocks(std::move(g));
}

Config offload_config() {
  Config c;
  c.offload.optimizer = OffloadTarget::kCpu;
  c.train.precision = Precision::kBf16;
  c.offload.host_memory_fraction = 1.0;
  return c;
}

TEST(ModulePlan, AHostBelowTheMastersAndStatesIsRefusedWithTheFix) {
  const ModuleBlocks blocks = six_blocks(1000);
  Config c = offload_config();
  HostShare host;
  host.available = 6 * 1000 * 12 - 1;  // one byte short of fp32 master, m and v for every Block
  const std::string err = test::error_of([&] { plan_module_host(c, blocks, host, 0); });
  EXPECT_NE(err.find("the host cannot hold the masters and Adam states"), std::string::npos) << err;
  EXPECT_NE(err.find("optim.state_dtype=bf16"), std::string::npos) << err;
  EXPECT_NE(err.find("optim.master_dtype=bf16"), std::string::npos) << err;
  host.shards = 2;  // ZeRO-2: each rank holds half
  EXPECT_NO_THROW(plan_module_host(c, blocks, host, 0));
}

TEST(ModulePlan, PerBlockBuffersWhenTheyFitElseARingOfFourSlots) {
  const ModuleBlocks blocks = six_blocks(1000);
  HostShare host;
  Config roomy = offload_config();  // host_ring=auto
  host.available = int64_t(1) << 30;
  EXPECT_EQ(plan_module_host(roomy, blocks, host, 0), 0);
  EXPECT_EQ(roomy.offload.host_ring, 0) << "per-Block buffers fit";
  Config tight = offload_config();
  // Masters and states (12 B) fit, per-Block landing and staging (2 + 2 B) and the undo log do not.
  host.available = 6 * 1000 * 12 + 4 * 1000 * 4;
  plan_module_host(tight, blocks, host, 0);
  EXPECT_EQ(tight.offload.host_ring, 4);
  EXPECT_EQ(tight.offload.speculate, Speculation::kAuto) << "a ring speculates without an undo log";
}

// Note [NVMe tier]: with offload.nvme_path the floor is the masters alone, and auto takes the fewest
// of the last Blocks whose moments on the tier (with its three bounce slots) make the host fit.
TEST(ModulePlan, TheNvmeTierTakesTheFewestLastBlocksThatMakeTheHostFit) {
  const ModuleBlocks blocks = six_blocks(1000);
  HostShare host;
  Config c = offload_config();
  c.offload.host_ring = 0;
  c.offload.nvme_path = "/tmp/unused";
  // Masters 4 B x 6000, landing and staging 4 B x 6000 for every Block; moments 8 B of the Blocks
  // off the tier, and 3 bounce slots of 8000 B: n on the tier needs 48000 + 8000 (6 - n) + 24000.
  host.available = 48000 + 8000 * 4 + 24000;  // two Blocks on the tier
  EXPECT_EQ(plan_module_host(c, blocks, host, 0), 0);
  EXPECT_EQ(c.offload.nvme_blocks, 2);
  EXPECT_EQ(c.offload.speculate, Speculation::kNever) << "no undo log on disk";
  Config roomy = offload_config();
  roomy.offload.nvme_path = "/tmp/unused";
  host.available = int64_t(1) << 30;
  plan_module_host(roomy, blocks, host, 0);
  EXPECT_EQ(roomy.offload.nvme_blocks, 0) << "the host holds everything: nothing on disk";
  EXPECT_EQ(roomy.offload.speculate, Speculation::kAuto);
  // Below the masters alone nothing fits, with the tier named only when it is not set.
  Config none = offload_config();
  host.available = 6 * 1000 * 4 - 1;
  EXPECT_NE(test::error_of([&] { plan_module_host(none, blocks, host, 0); }).find("offload.nvme_path"),
            std::string::npos);
  Config bare = offload_config();
  bare.offload.nvme_path = "/tmp/unused";
  const std::string err = test::error_of([&] { plan_module_host(bare, blocks, host, 0); });
  EXPECT_NE(err.find("the host cannot hold the masters:"), std::string::npos) << err;
}

TEST(ModulePlan, TheLowerBoundIsTheFewestGpuBlocksWhoseHostSideFits) {
  const ModuleBlocks blocks = six_blocks(1000);
  Config c = offload_config();
  c.offload.host_ring = 0;
  c.offload.speculate = Speculation::kNever;  // no undo log
  HostShare host;
  host.available = 3 * 1000 * 16;  // three CPU-updated Blocks' masters, states and buffers (12 + 2 + 2 B)
  EXPECT_EQ(plan_module_host(c, blocks, host, 5), 3) << "Blocks 3, 4, 5 on the host: the first 3 on the GPU";
  EXPECT_EQ(plan_module_host(c, blocks, host, 6), 3) << "the same bound from any split that fits";
}

TEST(ModulePlan, AGivenSplitCountsDecoderLayers) {
  const ModuleBlocks blocks = six_blocks(10);
  Config c = offload_config();
  const c10::Device cpu(torch::kCPU);
  c.offload.update_split = "0.5";
  EXPECT_EQ(plan_module_split(c, blocks, cpu), (std::pair<int64_t, int64_t>{3, 6}))
      << "the embedding and two of four layers; the CPU as the device limits nothing";
  c.offload.update_split = "0";
  EXPECT_EQ(plan_module_split(c, blocks, cpu).first, 0);
  c.offload.update_split = "1";
  EXPECT_EQ(plan_module_split(c, blocks, cpu).first, 5) << "every layer; the head after them stays on the host";
  c.offload.update_split = "auto";
  EXPECT_EQ(plan_module_split(c, blocks, cpu), (std::pair<int64_t, int64_t>{6, 6}));
}

}  // namespace
}  // namespace tandem
