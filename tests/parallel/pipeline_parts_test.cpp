// A pipeline stage's parts (parallel/pipeline_parts.h): empty parts are "off", and a stage
// describes itself by its Blocks' indices and names and its place in the grid.

#include "tandem/parallel/pipeline_parts.h"

#include <gtest/gtest.h>

#include <memory>

#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"

namespace tandem {
namespace {

TEST(PipelineParts, AStageDescribesItsBlocksAndItsPlaceInTheGrid) {
  ModelSpec spec = preset_spec("tiny");
  spec.n_layer = 4;  // Blocks: embed, layer.0 .. layer.3, head
  auto model = build_model(spec, false);
  PipelineParts parts;
  EXPECT_FALSE(parts.on()) << "no step: not a pipeline run";
  parts.grid = PipelineGrid(/*rank=*/3, /*world=*/4, /*stages=*/2);  // stage 1, replica 1
  parts.blocks = std::make_unique<StageBlocks>(*model, 3, 6);
  EXPECT_EQ(describe_stage(parts, *model), "stage 1 of 2 (Blocks 3 .. 5 of 6: layer.2 .. head), replica 1 of 2");
  PipelineParts moved = std::move(parts);
  EXPECT_EQ(moved.blocks->first(), 3u);
}

}  // namespace
}  // namespace tandem
