// One optimizer step through the StepRunner: its loss is the model's on the loader's batch, an
// injected out-of-memory error is retried at half the micro-batch with the same samples, and the
// evaluation leaves the model in training mode.
#include "tandem/run/step_runner.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "tandem/core/fault.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/models/model.h"
#include "tandem/optim/optimizer.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"
#include "tandem/run/step_timer.h"

namespace tandem {
namespace {

struct Rig {
  RunContext ctx;
  RunPlan plan;
  std::shared_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  StepTimer timer{torch::Device(torch::kCPU)};
  std::vector<nlohmann::json> rows;
  std::unique_ptr<StepRunner> runner;
  std::unique_ptr<BatchLoader> loader;

  explicit Rig(const Config& c) : ctx(open_run_context(c)) {
    plan = resolve_run_plan(c, {}, ctx);
    torch::manual_seed(c.train.seed);
    model = build_model(plan.spec, false);
    optimizer = make_optimizer(plan.cfg.optim, model->hf_parameters(), ctx.device);
    std::vector<torch::Tensor> params;
    for (auto& [name, p] : model->hf_parameters()) params.push_back(p);
    StepTargets targets;
    targets.optimizer = optimizer.get();
    targets.params = params;
    runner = std::make_unique<StepRunner>(
        plan, ctx, *model, targets, nullptr, timer, [this](const nlohmann::json& r) { rows.push_back(r); },
        TrainerState{});
    loader = std::make_unique<BatchLoader>(open_data(plan.cfg.data).train, plan.cfg.train.micro_batch, plan.seq_len,
                                           plan.cfg.train.seed, ctx.device, 1, plan.spec.vocab_size, "training");
  }
};

Config small(const std::string& dir) {
  Config c = test::tiny_cpu_config(dir, 3);
  c.train.micro_batch = 4;
  c.train.seq_len = 32;
  return c;
}

TEST(StepRunner, TheStepsLossIsTheModelsOnItsBatch) {
  test::TempDir dir;
  Rig r(small(dir.path()));
  Batch b = r.loader->next();
  r.loader->seek(0);
  double want;
  {
    torch::NoGradGuard no_grad;
    want = r.model->loss(r.model->forward(b.inputs), b.targets).item<double>();
  }
  const StepResult got = r.runner->run(0, 1e-3, *r.loader, 1.0);
  EXPECT_DOUBLE_EQ(got.loss, want);
  EXPECT_GT(got.grad_norm, 0);
  EXPECT_FALSE(got.skipped);
  EXPECT_EQ(r.loader->position(), 1) << "one micro-batch per step";
}

TEST(StepRunner, AnOutOfMemoryErrorIsRetriedAtHalfTheMicroBatch) {
  test::TempDir a_dir, b_dir;
  Rig plain(small(a_dir.path()));
  Rig retried(small(b_dir.path()));
  const StepResult want = plain.runner->run(0, 1e-3, *plain.loader, 1.0);
  const FaultScope oom("oom_above_tokens=64");  // 4 rows of 32 fail; 2 rows pass
  const StepResult got = retried.runner->run(0, 1e-3, *retried.loader, 1.0);
  EXPECT_NEAR(got.loss, want.loss, 1e-6 * want.loss) << "the same samples, summed in another order";
  EXPECT_EQ(retried.runner->oom_retries(), 1);
  ASSERT_EQ(retried.rows.size(), 1u);
  EXPECT_EQ(retried.rows[0].value("micro_batch_effective", 0), 2);
  EXPECT_EQ(retried.runner->driver().split().parts(4), 2) << "the next steps keep the cut";
}

TEST(StepRunner, EvaluationLeavesTheModelTraining) {
  test::TempDir dir;
  Rig r(small(dir.path()));
  const double loss = r.runner->evaluate(*r.loader, 2);
  EXPECT_GT(loss, 0);
  EXPECT_TRUE(r.model->is_training());
  EXPECT_EQ(r.runner->evaluate(*r.loader, 2), loss) << "from the loader's start each time";
}

}  // namespace
}  // namespace tandem
