// What a run trains and what updates it (run/trainable.h): the model's parameters under its optimizer,
// or the offload engine's adapter; a pipeline stage's Blocks under the gathering optimizer; a reducer
// exactly when replicas sum without the engine; the step driver's targets. Ranks are threads.
#include "tandem/run/trainable.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../test_util.h"
#include "rank_contexts.h"
#include "tandem/engine/param_store.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/optim/optimizer.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/grad_reducer.h"
#include "tandem/parallel/pipeline_checkpoint.h"
#include "tandem/parallel/pipeline_parts.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/parallel/stage_link.h"
#include "tandem/run/checkpointer.h"
#include "tandem/run/placement_driver.h"
#include "tandem/run/run_metrics.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"

namespace tandem {
namespace {

std::set<std::string> state_names(Optimizer& o) {
  std::set<std::string> out;
  for (const auto& [name, t] : o.state()) out.insert(name);
  return out;
}

Config one_process(const std::string& dir) {
  Config c = test::tiny_cpu_config(dir, 1);
  c.monitor.enabled = false;
  return c;
}

TEST(Trainable, ResidentParametersAreTheWholeModelsUnderTheConfigsOptimizer) {
  test::TempDir dir;
  const Config c = one_process(dir.path());
  RunContext ctx = open_run_context(c);
  RunPlan plan = resolve_run_plan(c, {}, ctx);
  auto model = build_model(plan.spec, false);
  PipelineParts no_pipeline;
  RunMetrics metrics(plan.cfg, plan.run_dir, "test", ctx, "GPU-resident");
  Trainable t = build_trainable(*model, no_pipeline, plan, ctx, metrics, 0.0);

  const auto named = model->hf_parameters();
  ASSERT_EQ(t.params.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) EXPECT_TRUE(t.params[i].is_same(named[i].second)) << named[i].first;
  EXPECT_EQ(t.engine(), nullptr);
  EXPECT_EQ(t.gathered, nullptr) << "no pipeline";
  EXPECT_EQ(t.reducer, nullptr) << "one process: nothing to reduce";
  ASSERT_NE(t.stage_optimizer, nullptr);
  EXPECT_EQ(&t.optimizer(), t.stage_optimizer.get());
  const auto states = state_names(t.optimizer());
  for (const auto& [name, p] : named) EXPECT_EQ(states.count(name + ".exp_avg_sq"), 1u) << name << " has no state";

  const StepTargets targets = t.targets();
  EXPECT_EQ(targets.optimizer, &t.optimizer());
  EXPECT_EQ(targets.engine, nullptr);
  EXPECT_EQ(targets.store, nullptr);
  EXPECT_EQ(targets.reducer, nullptr);
  EXPECT_EQ(targets.placement, nullptr);
  ASSERT_EQ(targets.params.size(), t.params.size());
  EXPECT_TRUE(targets.params.front().is_same(t.params.front()));

  // The optimizer moves the parameters it was given.
  const torch::Tensor before = t.params.front().detach().clone();
  for (auto& p : t.params) p.mutable_grad() = torch::ones_like(p);
  targets.optimizer->step(1e-2);
  EXPECT_FALSE(torch::equal(t.params.front().detach(), before));

  Trainable moved = std::move(t);
  EXPECT_EQ(&moved.optimizer(), targets.optimizer) << "moving keeps the optimizer the driver points at";
}

TEST(Trainable, TheOffloadEngineUpdatesThroughItsAdapterAndKeepsNoResidentParameters) {
  test::TempDir dir;
  Config c = one_process(dir.path());
  c.offload.optimizer = OffloadTarget::kCpu;
  RunContext ctx = open_run_context(c);
  RunPlan plan = resolve_run_plan(c, {}, ctx);
  auto model = build_model(plan.spec, false);
  PipelineParts no_pipeline;
  RunMetrics metrics(plan.cfg, plan.run_dir, "test", ctx, "offload engine");
  Trainable t = build_trainable(*model, no_pipeline, plan, ctx, metrics, 0.0);

  ASSERT_NE(t.engine(), nullptr);
  ASSERT_NE(t.offload.store, nullptr);
  EXPECT_TRUE(t.params.empty()) << "the engine owns the update";
  EXPECT_NE(dynamic_cast<EngineOptimizer*>(t.stage_optimizer.get()), nullptr);
  EXPECT_EQ(&t.optimizer(), t.stage_optimizer.get());
  EXPECT_EQ(t.offload.store->blocks().size(), model->block_count());
  const StepTargets targets = t.targets();
  EXPECT_EQ(targets.engine, t.engine());
  EXPECT_EQ(targets.store, t.offload.store.get());
  EXPECT_EQ(targets.placement, nullptr) << "placement.policy=off";
  EXPECT_EQ(targets.reducer, nullptr);
  EXPECT_TRUE(targets.params.empty());
}

TEST(Trainable, APlacementPolicyGivesTheStepDriverItsPlacementDriver) {
  test::TempDir dir;
  Config c = one_process(dir.path());
  c.offload.optimizer = OffloadTarget::kCpu;
  c.placement.policy = PlacementPolicyKind::kStatic;
  c.placement.blocks = StaticBlocks::parse("GCCGGG");
  RunContext ctx = open_run_context(c);
  RunPlan plan = resolve_run_plan(c, {}, ctx);
  auto model = build_model(plan.spec, false);
  PipelineParts no_pipeline;
  RunMetrics metrics(plan.cfg, plan.run_dir, "test", ctx, "offload engine");
  Trainable t = build_trainable(*model, no_pipeline, plan, ctx, metrics, 0.0);
  ASSERT_NE(t.offload.placement, nullptr);
  EXPECT_EQ(t.targets().placement, t.offload.placement.get());
}

// Config for the threaded ranks: the fused kernel, so that no rank reconfigures the process's CPU
// thread pool while another uses it.
Config threaded(const std::string& dir) {
  Config c = one_process(dir);
  c.optim.impl = OptimizerImpl::kFused;
  return c;
}

RunPlan resident_plan(const Config& c) {
  RunPlan plan;
  plan.cfg = c;
  plan.offload = false;
  plan.run_dir = c.train.run_dir;
  return plan;
}

ModelSpec untied_spec() {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 16, s.n_head = 2, s.n_kv_head = 2, s.d_ff = 32;
  s.vocab_size = 64, s.max_seq_len = 16, s.tie_embeddings = false;
  return s;
}

TEST(Trainable, ReplicasWithoutTheEngineSumTheirGradientsThroughAReducer) {
  test::TempDir dir;
  const Config c = threaded(dir.path());
  const auto errors = test::on_rank_contexts(2, test::port(4), [&](RunContext& ctx) {
    auto model = build_model(untied_spec(), false);
    const RunPlan plan = resident_plan(c);
    PipelineParts no_pipeline;
    RunMetrics metrics(plan.cfg, plan.run_dir, "test", ctx, "GPU-resident");
    Trainable t = build_trainable(*model, no_pipeline, plan, ctx, metrics, 0.0);
    ASSERT_NE(t.reducer, nullptr) << "two replicas";
    EXPECT_EQ(t.targets().reducer, t.reducer.get());
    EXPECT_EQ(t.params.size(), model->hf_parameters().size());
  });
  test::expect_no_errors(errors);
}

// A pipeline stage's parts over `model`, laid out as run/pipeline_setup does for an even cut.
PipelineParts stage_parts(Model& model, Comm& comm, int stages) {
  comm.split_pipeline(stages);
  PipelineParts parts;
  parts.grid = PipelineGrid(comm.rank(), comm.world(), stages);
  parts.ends = even_pipeline_cut(stages, static_cast<int64_t>(model.block_count()));
  const int s = parts.grid.stage();
  const auto first = static_cast<size_t>(s == 0 ? 0 : parts.ends[static_cast<size_t>(s - 1)]);
  const auto end = static_cast<size_t>(parts.ends[static_cast<size_t>(s)]);
  const c10::Device cpu(c10::kCPU);
  parts.blocks = std::make_unique<StageBlocks>(model, first, end);
  parts.link = std::make_unique<StageLink>(comm, parts.grid, cpu);
  parts.step = std::make_unique<PipelineStep>(model, parts.grid, *parts.link, first, end, PipelineSchedule::k1F1B,
                                              Precision::kFp32, cpu);
  return parts;
}

TEST(Trainable, AStageTrainsItsOwnBlocksUnderTheGatheringOptimizer) {
  test::TempDir dir;
  const Config c = threaded(dir.path());
  const auto errors = test::on_rank_contexts(2, test::port(5), [&](RunContext& ctx) {
    auto model = build_model(untied_spec(), false);
    PipelineParts parts = stage_parts(*model, *ctx.comm, 2);
    const RunPlan plan = resident_plan(c);
    RunMetrics metrics(plan.cfg, plan.run_dir, "test", ctx, "GPU-resident");
    Trainable t = build_trainable(*model, parts, plan, ctx, metrics, 0.0);
    ASSERT_NE(t.gathered, nullptr);
    EXPECT_EQ(&t.optimizer(), static_cast<Optimizer*>(t.gathered.get())) << "checkpoints read the stages' states";
    EXPECT_EQ(t.reducer, nullptr) << "one replica per stage";
    const auto mine = parts.blocks->hf_parameters();
    ASSERT_EQ(t.params.size(), mine.size());
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(t.params[i].is_same(mine[i].second)) << mine[i].first;
    const auto states = state_names(*t.stage_optimizer);
    for (const auto& [name, p] : model->hf_parameters()) {
      bool own = false;
      for (const auto& [n, q] : mine) own = own || n == name;
      EXPECT_EQ(states.count(name + ".exp_avg_sq"), own ? 1u : 0u) << name << " on rank " << ctx.ranks.rank;
    }
  });
  test::expect_no_errors(errors);
}

TEST(Trainable, AStagesReplicasShareAReducerOverTheStagesBlocks) {
  test::TempDir dir;
  const Config c = threaded(dir.path());
  const auto errors = test::on_rank_contexts(4, test::port(6), [&](RunContext& ctx) {
    auto model = build_model(untied_spec(), false);
    PipelineParts parts = stage_parts(*model, *ctx.comm, 2);
    ASSERT_EQ(ctx.comm->replicas(), 2);
    const RunPlan plan = resident_plan(c);
    RunMetrics metrics(plan.cfg, plan.run_dir, "test", ctx, "GPU-resident");
    Trainable t = build_trainable(*model, parts, plan, ctx, metrics, 0.0);
    EXPECT_NE(t.gathered, nullptr);
    ASSERT_NE(t.reducer, nullptr) << "two replicas of each stage";
    EXPECT_EQ(t.params.size(), parts.blocks->hf_parameters().size());
  });
  test::expect_no_errors(errors);
}

}  // namespace
}  // namespace tandem
