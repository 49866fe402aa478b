// A pipeline stage's view of a Model (models/stage_blocks.h): Blocks [first, end) under the
// stage's own indices, their parameters once each, the before-Block call only for the stage's
// Blocks (with stage indices), and host flags placed at the stage's offset in the Model.

#include "tandem/models/stage_blocks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/models/model.h"

namespace tandem {
namespace {

ModelSpec small_spec() {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 4, s.d_model = 32, s.n_head = 4, s.n_kv_head = 2, s.d_ff = 48, s.vocab_size = 50, s.max_seq_len = 16;
  return s;  // Blocks: embed, layer.0 .. layer.3, head
}

// A Model that records the host flags it is given.
class RecordingModel : public Model {
 public:
  using Model::Model;
  void set_host_blocks(std::vector<bool> host) override {
    recorded.push_back(host);
    Model::set_host_blocks(std::move(host));
  }
  std::vector<std::vector<bool>> recorded;
};

TEST(StageBlocks, BlocksAreTheModelsFromFirstUnderTheStagesIndices) {
  torch::manual_seed(1);
  Model m(small_spec(), false);
  StageBlocks stage(m, 2, 5);
  EXPECT_EQ(stage.first(), 2u);
  EXPECT_EQ(stage.end(), 5u);
  EXPECT_EQ(&stage.model(), &m);
  ASSERT_EQ(stage.block_count(), 3u);
  const std::vector<std::string> names = {"layer.1", "layer.2", "layer.3"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(stage.block_name(i), names[i]);
    EXPECT_EQ(stage.block_kind(i), BlockKind::kLayer);
    const auto mine = stage.block_parameters(i), theirs = m.block_parameters(2 + i);
    ASSERT_EQ(mine.size(), theirs.size());
    for (size_t k = 0; k < mine.size(); ++k) {
      EXPECT_EQ(mine[k].first, theirs[k].first);
      EXPECT_TRUE(mine[k].second.is_same(theirs[k].second)) << mine[k].first;
    }
  }
  StageBlocks last(m, 4, 6);
  EXPECT_EQ(last.block_kind(0), BlockKind::kLayer);
  EXPECT_EQ(last.block_kind(1), BlockKind::kHead);
  EXPECT_EQ(last.block_name(1), "head");
  StageBlocks first(m, 0, 1);
  EXPECT_EQ(first.block_kind(0), BlockKind::kEmbedding);
}

TEST(StageBlocks, HfParametersAreTheStagesBlocksInOrderEachOnce) {
  torch::manual_seed(2);
  for (const bool tied : {false, true}) {
    ModelSpec s = small_spec();
    s.tie_embeddings = tied;
    Model m(s, false);
    // The whole model as one stage: exactly Model::hf_parameters.
    StageBlocks all(m, 0, m.block_count());
    const auto a = all.hf_parameters(), b = m.hf_parameters();
    ASSERT_EQ(a.size(), b.size()) << "tied " << tied;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(a[i].second.is_same(b[i].second)) << a[i].first;
    }
    // Two stages cut the parameters between them.
    StageBlocks front(m, 0, 3), back(m, 3, m.block_count());
    std::set<std::string> names;
    size_t count = 0;
    for (auto* st : {&front, &back})
      for (auto& [n, p] : st->hf_parameters()) {
        EXPECT_TRUE(names.insert(n).second) << n << " in both stages";
        ++count;
      }
    EXPECT_EQ(count, b.size());
    for (auto& [n, p] : back.hf_parameters())
      EXPECT_NE(n.rfind("model.layers.0.", 0), 0u) << n << ": layer.0 is Block 1, in the front stage";
  }
}

TEST(StageBlocks, TheBeforeBlockCallSeesOnlyTheStagesBlocksWithItsIndices) {
  torch::manual_seed(3);
  Model m(small_spec(), false);
  StageBlocks stage(m, 2, 5);
  std::vector<size_t> calls;
  stage.set_before_block([&](size_t i) { calls.push_back(i); });
  const auto tokens = torch::randint(0, 50, {1, 5}, torch::kInt64);
  m.forward(tokens);
  EXPECT_EQ(calls, (std::vector<size_t>{0, 1, 2})) << "Blocks 2, 3, 4 of the Model are the stage's 0, 1, 2";
  // The stage's own forward (as the pipeline runs it) gives the same calls.
  calls.clear();
  const auto act = m.forward_blocks(tokens, 0, 2);
  m.forward_blocks(act, 2, 5);
  EXPECT_EQ(calls, (std::vector<size_t>{0, 1, 2}));
  // An empty function removes the call.
  stage.set_before_block({});
  calls.clear();
  m.forward(tokens);
  EXPECT_TRUE(calls.empty());
}

TEST(StageBlocks, HostFlagsLandAtTheStagesOffsetInTheModel) {
  torch::manual_seed(4);
  RecordingModel m(small_spec(), false);
  StageBlocks stage(m, 2, 5);
  stage.set_host_blocks({true, false, true});
  ASSERT_EQ(m.recorded.size(), 1u);
  EXPECT_EQ(m.recorded[0], (std::vector<bool>{false, false, true, false, true, false}));
  // Flags beyond the stage's Blocks are ignored; fewer flags leave the rest on the device.
  stage.set_host_blocks({true, true, true, true, true});
  EXPECT_EQ(m.recorded[1], (std::vector<bool>{false, false, true, true, true, false}));
  stage.set_host_blocks({true});
  EXPECT_EQ(m.recorded[2], (std::vector<bool>{false, false, true, false, false, false}));
  stage.set_host_blocks({});
  EXPECT_EQ(m.recorded[3], std::vector<bool>(6, false));
  // On one device a host-run Block is the same computation.
  torch::NoGradGuard g;
  const auto tokens = torch::randint(0, 50, {2, 7}, torch::kInt64);
  const auto with_flags = m.forward(tokens);
  stage.set_host_blocks({});
  EXPECT_TRUE(torch::equal(m.forward(tokens), with_flags));
}

TEST(StageBlocks, ARangeOutsideTheModelIsABug) {
  Model m(small_spec(), false);
  EXPECT_THROW(StageBlocks(m, 3, 3), InternalError);
  EXPECT_THROW(StageBlocks(m, 4, 2), InternalError);
  EXPECT_THROW(StageBlocks(m, 0, 7), InternalError);
  EXPECT_NO_THROW(StageBlocks(m, 5, 6));
}

}  // namespace
}  // namespace tandem
