// The keyword-or-value keys (core/config_values.h): each form parsed to its kind, written back as
// the user would, and a wrong one refused with the key, the text and the accepted forms.

#include "tandem/core/config_values.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "tandem/core/config.h"

namespace tandem {
namespace {

using test::error_of;

TEST(ConfigValues, RowBalanceKindsAndRows) {
  EXPECT_EQ(RowBalance::parse("equal").kind, RowBalance::Kind::kEqual);
  EXPECT_EQ(RowBalance::parse(" Auto ").kind, RowBalance::Kind::kAuto);
  const auto given = RowBalance::parse("6, 2");
  EXPECT_EQ(given.kind, RowBalance::Kind::kGiven);
  EXPECT_EQ(given.rows, (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(given.str(), "6,2");
  const std::string bad = error_of([] { RowBalance::parse("6,0"); });
  EXPECT_NE(bad.find("dist.balance='6,0' is not a list of row counts"), std::string::npos) << bad;
  EXPECT_NE(bad.find("equal, auto"), std::string::npos) << bad;
  EXPECT_NE(error_of([] { RowBalance::parse("fair"); }).find("dist.balance='fair'"), std::string::npos);
}

TEST(ConfigValues, PipelineCutKindsAndEnds) {
  EXPECT_EQ(PipelineCut::parse("").kind, PipelineCut::Kind::kPartitioner);
  EXPECT_EQ(PipelineCut::parse("even").kind, PipelineCut::Kind::kEven);
  const auto given = PipelineCut::parse("3,6");
  EXPECT_EQ(given.ends, (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(given.str(), "3,6");
  EXPECT_EQ(PipelineCut{}.str(), "");
  EXPECT_NE(error_of([] { PipelineCut::parse("1,,2"); }).find("is not a comma list of Block indices"),
            std::string::npos);
}

TEST(ConfigValues, StaticBlocksAndMovableBlocks) {
  EXPECT_EQ(StaticBlocks::parse("gpu").kind, StaticBlocks::Kind::kGpu);
  EXPECT_EQ(StaticBlocks::parse("CPU").kind, StaticBlocks::Kind::kCpu);
  const auto letters = StaticBlocks::parse("GcCG");
  EXPECT_EQ(letters.on_cpu, (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(letters.str(), "GCCG");
  EXPECT_NE(error_of([] { StaticBlocks::parse("GXG"); }).find("'X' is neither G (GPU) nor C (CPU)"), std::string::npos);
  EXPECT_EQ(MovableBlocks::parse("").kind, MovableBlocks::Kind::kLayers);
  EXPECT_EQ(MovableBlocks::parse("none").kind, MovableBlocks::Kind::kNone);
  EXPECT_EQ(MovableBlocks::parse("1, 2").blocks, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(MovableBlocks::parse("1,2").str(), "1,2");
  EXPECT_NE(error_of([] { MovableBlocks::parse("x"); }).find("placement.movable='x'"), std::string::npos);
}

TEST(ConfigValues, DevicesOfTheRunAndOfEachStage) {
  const auto stages = StageDevices::parse("cuda:1, cpu");
  ASSERT_EQ(stages.devices.size(), 2u);
  EXPECT_EQ(stages.devices[0].index, 1);
  EXPECT_TRUE(stages.any_cpu());
  EXPECT_EQ(stages.str(), "cuda:1,cpu");
  EXPECT_TRUE(StageDevices::parse("").empty());
  EXPECT_FALSE(StageDevices::parse("cuda,cuda").any_cpu());
  EXPECT_NE(error_of([] { StageDevices::parse("cuda,tpu"); }).find("dist.pipeline_devices 'tpu' is not a device"),
            std::string::npos);
  Config c;
  EXPECT_EQ(c.train.device.kind, DeviceSpec::Kind::kAuto);
  apply_override(c, "train.device=cuda:2");
  EXPECT_EQ(c.train.device.kind, DeviceSpec::Kind::kCuda);
  EXPECT_EQ(get_config_key(c, "train.device"), "cuda:2");
  EXPECT_NE(error_of([&] { apply_override(c, "train.device=gpu"); }).find("train.device 'gpu' is not a device"),
            std::string::npos);
}

TEST(ConfigValues, TheKeysParseOnceAndWriteBack) {
  Config c;
  apply_override(c, "dist.balance=5,3");
  apply_override(c, "dist.pipeline_cut=even");
  apply_override(c, "placement.blocks=GGCG");
  apply_override(c, "placement.movable=none");
  EXPECT_EQ(c.dist.balance.rows, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(c.dist.pipeline_cut.kind, PipelineCut::Kind::kEven);
  EXPECT_EQ(c.placement.blocks.kind, StaticBlocks::Kind::kLetters);
  EXPECT_EQ(c.placement.movable.kind, MovableBlocks::Kind::kNone);
  EXPECT_EQ(get_config_key(c, "dist.balance"), "5,3");
  EXPECT_EQ(get_config_key(c, "placement.blocks"), "GGCG");
  EXPECT_EQ(get_config_key(c, "placement.movable"), "none");
  EXPECT_EQ(get_config_key(Config{}, "dist.pipeline_cut"), "");
  EXPECT_NE(error_of([&] { apply_override(c, "dist.balance=lots"); }).find("dist.balance='lots'"), std::string::npos);
}

}  // namespace
}  // namespace tandem
