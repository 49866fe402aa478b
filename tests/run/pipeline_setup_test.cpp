// A pipeline run's pieces from its plan (run/pipeline_setup.h), ranks as threads on loopback Gloo: a
// given cut builds each rank's stage and settles its plan, one stage builds nothing, and what cannot
// run is refused on every rank with the fix. The partitioner's cut is left to the CLI's tests.
#include "tandem/run/pipeline_setup.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../error_of.h"
#include "rank_contexts.h"
#include "tandem/data/loader.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/run/run_plan.h"

namespace tandem {
namespace {

// Four Blocks (embedding, 2 layers, head), untied.
ModelSpec small_spec(bool tied = false) {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 16, s.n_head = 2, s.n_kv_head = 2, s.d_ff = 32;
  s.vocab_size = 64, s.max_seq_len = 16, s.tie_embeddings = tied;
  return s;
}

RunPlan plan_for(const Config& c, const ModelSpec& spec) {
  RunPlan plan;
  plan.cfg = c;
  plan.spec = spec;
  plan.seq_len = 8;
  plan.offload = false;
  return plan;
}

Config stages(const std::string& count, const std::string& cut) {
  Config c;
  c.train.device.kind = DeviceSpec::Kind::kCpu;
  c.dist.pipeline_stages = count;
  c.dist.pipeline_cut = PipelineCut::parse(cut);
  return c;
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(PipelineSetup, AGivenCutBuildsEachRanksStageAndSettlesItsPlan) {
  const auto errors = test::on_rank_contexts(2, test::port(0), [](RunContext& ctx) {
    Config c = stages("2", "even");
    c.dist.pipeline_schedule = PipelineSchedule::kGPipe;
    c.train.grad_accum = 4;
    auto model = build_model(small_spec(), false);
    RunPlan plan = plan_for(c, model->spec());
    const PipelineParts parts = open_pipeline(*model, plan, ctx);
    const int r = ctx.ranks.rank;
    ASSERT_TRUE(parts.on());
    EXPECT_EQ(parts.grid.stage(), r);
    EXPECT_EQ(parts.grid.stages(), 2);
    EXPECT_EQ(parts.ends, (std::vector<int64_t>{2, 4}));
    EXPECT_EQ(parts.predicted_step_s, 0.0) << "a given cut predicts nothing";
    const size_t first = r == 0 ? 0 : 2, end = r == 0 ? 2 : 4;
    EXPECT_EQ(parts.blocks->first(), first);
    EXPECT_EQ(parts.blocks->end(), end);
    EXPECT_EQ(parts.step->first(), first);
    EXPECT_EQ(parts.step->end(), end);
    EXPECT_EQ(parts.step->schedule(), PipelineSchedule::kGPipe) << "dist.pipeline_schedule";
    EXPECT_NE(parts.link, nullptr);
    // The plan now has the stage's layout (Note [Plan layout]) and the comm its stage groups.
    EXPECT_EQ(plan.stage_ends, (std::vector<int64_t>{2, 4}));
    EXPECT_EQ(plan.layout.stage, r);
    EXPECT_EQ(plan.layout.first, static_cast<int64_t>(first));
    EXPECT_EQ(plan.layout.end, static_cast<int64_t>(end));
    EXPECT_EQ(plan.layout.micro_batches, 4);
    EXPECT_EQ(ctx.comm->stages(), 2);
    EXPECT_EQ(ctx.comm->replicas(), 1);
    // The pieces run a step together (the same batches on both ranks): the loss arrives on the last stage.
    std::vector<Batch> batches(2);
    for (int64_t i = 0; i < 2; ++i) {
      batches[static_cast<size_t>(i)].inputs = torch::arange(16, torch::kInt64).reshape({2, 8}) % 64;
      batches[static_cast<size_t>(i)].targets = (torch::arange(16, torch::kInt64).reshape({2, 8}) + 1) % 64;
    }
    const auto unscaled = [](const torch::Tensor& l, int64_t) { return l; };
    const double loss = parts.step->run(batches, unscaled, [](bool) {}).item<double>();
    if (r == 1) {
      EXPECT_GT(loss, 0.0);
      EXPECT_TRUE(std::isfinite(loss));
    } else {
      EXPECT_EQ(loss, 0.0) << "the first stage holds no loss (no experts)";
    }
  });
  test::expect_no_errors(errors);
}

TEST(PipelineSetup, AutoWithAGivenCutTakesItsStageCount) {
  const auto errors = test::on_rank_contexts(2, test::port(1), [](RunContext& ctx) {
    auto model = build_model(small_spec(), false);
    RunPlan plan = plan_for(stages("auto", "3"), model->spec());
    const PipelineParts parts = open_pipeline(*model, plan, ctx);
    ASSERT_TRUE(parts.on());
    EXPECT_EQ(parts.ends, (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(parts.blocks->first(), ctx.ranks.rank == 0 ? 0u : 3u);
  });
  test::expect_no_errors(errors);
}

TEST(PipelineSetup, OneStageBuildsNothingAndLeavesTheGroupsWhole) {
  const auto errors = test::on_rank_contexts(2, test::port(2), [](RunContext& ctx) {
    auto model = build_model(small_spec(), false);
    RunPlan plan = plan_for(stages("1", ""), model->spec());
    const PipelineParts parts = open_pipeline(*model, plan, ctx);
    EXPECT_FALSE(parts.on());
    EXPECT_EQ(parts.blocks, nullptr);
    EXPECT_TRUE(plan.stage_ends.empty());
    EXPECT_EQ(ctx.comm->stages(), 1);
    EXPECT_EQ(ctx.comm->replicas(), 2) << "both ranks stay data-parallel replicas";
  });
  test::expect_no_errors(errors);
}

TEST(PipelineSetup, WhatAPipelineCannotRunWithIsRefusedOnEveryRank) {
  const auto errors = test::on_rank_contexts(2, test::port(3), [](RunContext& ctx) {
    const auto refusal = [&](Config c, bool tied = false) {
      auto model = build_model(small_spec(tied), false);
      RunPlan plan = plan_for(c, model->spec());
      return test::error_of([&] { open_pipeline(*model, plan, ctx); });
    };
    Config balance = stages("2", "even");
    balance.dist.balance = RowBalance::parse("auto");
    std::string err = refusal(balance);
    EXPECT_TRUE(has(err, "dist.balance=auto does not run with pipeline stages yet")) << err;
    EXPECT_TRUE(has(err, "dist.balance=equal or dist.pipeline_stages=1")) << err;

    Config placed = stages("2", "even");
    placed.placement.policy = PlacementPolicyKind::kStatic;
    err = refusal(placed);
    EXPECT_TRUE(has(err, "placement.policy runs in one process")) << err;

    err = refusal(stages("4", "even"));
    EXPECT_TRUE(has(err, "dist.pipeline_stages=4 does not divide the world of 2 ranks")) << err;

    err = refusal(stages("2", "even"), /*tied=*/true);
    EXPECT_TRUE(has(err, "ties its embedding and head")) << err;
    err = refusal(stages("auto", "2"), /*tied=*/true);
    EXPECT_TRUE(has(err, "ties its embedding and head")) << "a cut given with auto: " << err;

    err = refusal(stages("auto", "1,2"));  // three stages over two ranks
    EXPECT_TRUE(has(err, "does not divide the world of 2 ranks")) << err;

    err = refusal(stages("2", "5"));
    EXPECT_TRUE(has(err, "dist.pipeline_cut='5' must rise strictly within 1 .. 3")) << err;
    EXPECT_EQ(ctx.comm->stages(), 1) << "nothing was split";
  });
  test::expect_no_errors(errors);
}

TEST(PipelineSetup, OneProcessAskingForStagesIsToldHowToStartMore) {
  RunContext ctx;  // no comm: one process
  auto model = build_model(small_spec(), false);
  RunPlan plan = plan_for(stages("2", "even"), model->spec());
  const std::string err = test::error_of([&] { open_pipeline(*model, plan, ctx); });
  EXPECT_TRUE(has(err, "dist.pipeline_stages=2 needs 2 processes or more")) << err;
  EXPECT_TRUE(has(err, "tandem launch --nproc-per-node 2")) << err;

  RunPlan automatic = plan_for(stages("auto", ""), model->spec());
  EXPECT_FALSE(open_pipeline(*model, automatic, ctx).on()) << "auto in one process: one stage";
  RunPlan one = plan_for(stages("1", ""), model->spec());
  EXPECT_FALSE(open_pipeline(*model, one, ctx).on());
  RunPlan bad = plan_for(stages("two", ""), model->spec());
  EXPECT_TRUE(has(test::error_of([&] { open_pipeline(*model, bad, ctx); }), "dist.pipeline_stages must be auto"));
}

}  // namespace
}  // namespace tandem
