// The run's checkpoints through the Checkpointer: written, resumed into a fresh model and
// optimizer, written in the background, and failures that are reported, not thrown.
#include "tandem/run/checkpointer.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "tandem/models/model.h"
#include "tandem/optim/optimizer.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct Rig {
  RunContext ctx;
  RunPlan plan;
  std::shared_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<nlohmann::json> rows;
  std::unique_ptr<Checkpointer> checkpointer;

  Rig(const Config& c, const TrainOptions& options = {}) : ctx(open_run_context(c)) {
    plan = resolve_run_plan(c, options, ctx);
    torch::manual_seed(c.train.seed);
    model = build_model(plan.spec, false);
    optimizer = make_optimizer(plan.cfg.optim, model->hf_parameters(), ctx.device);
    checkpointer = std::make_unique<Checkpointer>(
        plan.cfg, plan.run_dir, ctx, checkpoint_model(*model), *optimizer, nullptr, nullptr,
        CheckpointReports{[this](const nlohmann::json& r) { rows.push_back(r); }, [](const std::string&) {}});
  }
};

TEST(Checkpointer, WritesAndResumesIntoAFreshModel) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 4);
  TrainerState state;
  {
    Rig a(c);
    fs::create_directories(dir.path());
    state = a.checkpointer->resume(a.plan.resume_dir);
    EXPECT_EQ(state.step, 0) << "nothing to resume";
    for (auto& [n, p] : a.model->hf_parameters()) p.data().add_(0.5);  // weights no fresh model has
    state.step = 2;
    state.data_position = 7;
    a.checkpointer->write(state, false);
    EXPECT_EQ(a.checkpointer->error(), "");
    EXPECT_EQ(a.checkpointer->last(), dir.file("checkpoints/step_00000002"));
    ASSERT_FALSE(a.rows.empty());
    EXPECT_TRUE(a.rows.back().contains("checkpoint_blocking_s"));
  }
  Config again = c;
  Rig b(again, {dir.file("checkpoints/step_00000002")});
  const TrainerState got = b.checkpointer->resume(b.plan.resume_dir);
  EXPECT_EQ(got.step, 2);
  EXPECT_EQ(got.data_position, 7);
  test::TempDir other;
  Rig fresh(test::tiny_cpu_config(other.path(), 4));
  for (auto& [n, p] : b.model->hf_parameters()) {
    torch::Tensor f;
    for (auto& [m, q] : fresh.model->hf_parameters())
      if (m == n) f = q;
    EXPECT_TRUE(torch::equal(p, f + 0.5)) << n;
  }
}

TEST(Checkpointer, ABackgroundWriteIsCollected) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 4);
  c.train.async_checkpoint = true;
  Rig r(c);
  fs::create_directories(dir.path());
  TrainerState s = r.checkpointer->resume(r.plan.resume_dir);
  s.step = 1;
  r.checkpointer->write(s, true);
  r.checkpointer->collect(true);
  EXPECT_EQ(r.checkpointer->last(), dir.file("checkpoints/step_00000001"));
  EXPECT_EQ(verify_checkpoint(r.checkpointer->last()), "");
  r.checkpointer->finish(s, false);
  EXPECT_FALSE(r.checkpointer->unsaved());
}

TEST(Checkpointer, AFailedWriteIsReportedAndTheRunEndUnsaved) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.file("run"), 4);
  Rig r(c);
  fs::create_directories(dir.file("run"));
  std::ofstream(dir.file("run/checkpoints")) << "a file where the directory should be";
  TrainerState s = r.checkpointer->resume(r.plan.resume_dir);
  s.step = 3;
  EXPECT_NO_THROW(r.checkpointer->finish(s, true));
  EXPECT_NE(r.checkpointer->error().find("step 3"), std::string::npos) << r.checkpointer->error();
  EXPECT_TRUE(r.checkpointer->unsaved());
  ASSERT_FALSE(r.rows.empty());
  EXPECT_TRUE(r.rows.back().contains("checkpoint_failed"));
}

}  // namespace
}  // namespace tandem
