// The step's mechanics shared by the CLI's trainer and the Python engine (run/step_driver.h), on
// device-resident parameters: one update read with its loss and norm, a non-finite gradient
// skipped with the fp16 scale backed off, an abandoned step's gradients cleared, and an
// out-of-memory retry's row and the rows after it.
#include "tandem/run/step_driver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../test_util.h"
#include "tandem/optim/optimizer.h"
#include "tandem/run/run_metrics.h"
#include "tandem/run/run_setup.h"

namespace tandem {
namespace {

struct Rig {
  Config cfg;
  RunContext ctx;
  torch::Tensor w = torch::ones({4}).requires_grad_(true);
  std::unique_ptr<Optimizer> optimizer;
  std::vector<nlohmann::json> published;
  std::unique_ptr<StepDriver> driver;

  explicit Rig(Config c, const TrainerState& state = TrainerState{}) : cfg(std::move(c)), ctx(open_run_context(cfg)) {
    optimizer = make_optimizer(cfg.optim, {{"w", w}}, ctx.device);
    StepTargets t;
    t.optimizer = optimizer.get();
    t.params = {w};
    driver = std::make_unique<StepDriver>(cfg, ctx, t, state,
                                          [this](const nlohmann::json& row) { published.push_back(row); });
  }
  void set_grad(std::vector<float> g) { w.mutable_grad() = torch::tensor(g); }
};

Config cpu_config(const std::string& dir) {
  Config c = test::tiny_cpu_config(dir, 1);
  c.monitor.enabled = false;
  c.train.grad_clip = 0;  // the update is AdamW's alone
  c.optim.weight_decay = 0;
  return c;
}

TEST(StepDriver, AStepUpdatesAndReadsItsLossAndNormOnce) {
  test::TempDir dir;
  Rig r(cpu_config(dir.path()));
  r.driver->begin_step(0, 0.1, nullptr);
  r.driver->begin_micro(true);
  r.set_grad({3, 4, 0, 0});
  r.driver->update(0.1);
  const StepResult got = r.driver->read(torch::tensor(2.5), 0);
  EXPECT_DOUBLE_EQ(got.loss, 2.5);
  EXPECT_NEAR(got.grad_norm, 5.0, 1e-6);
  EXPECT_FALSE(got.skipped);
  EXPECT_EQ(got.loss_scale, 1.0);
  // AdamW's first step moves each parameter with a gradient by lr against its sign.
  EXPECT_NEAR(r.w[0].item<double>(), 0.9, 1e-5);
  EXPECT_NEAR(r.w[1].item<double>(), 0.9, 1e-5);
  EXPECT_EQ(r.w[2].item<double>(), 1.0);
}

TEST(StepDriver, ANonFiniteGradientSkipsTheStepAndBacksTheFp16ScaleOff) {
  test::TempDir dir;
  Config c = cpu_config(dir.path());
  c.train.precision = Precision::kFp16;
  TrainerState resumed;
  resumed.loss_scale = 1024;
  Rig r(c, resumed);
  EXPECT_EQ(r.driver->loss_scale(), 1024);
  EXPECT_EQ(r.driver->scale_loss(torch::tensor(0.5)).item<double>(), 512);
  r.driver->begin_step(0, 0.1, nullptr);
  r.set_grad({1, std::numeric_limits<float>::infinity(), 0, 0});
  r.driver->update(0.1);
  const StepResult got = r.driver->read(torch::tensor(1.0), 0);
  EXPECT_TRUE(got.skipped);
  EXPECT_EQ(got.loss_scale, 512);
  EXPECT_EQ(r.driver->loss_scale(), 512) << "the next step's backward is scaled by the backed-off scale";
  EXPECT_TRUE(torch::equal(r.w.detach(), torch::ones({4}))) << "nothing updated";
  TrainerState saved;
  r.driver->save_scaler(saved);
  EXPECT_EQ(saved.loss_scale, 512);
}

TEST(StepDriver, WithoutFp16TheLossIsNotScaled) {
  test::TempDir dir;
  Rig r(cpu_config(dir.path()));
  EXPECT_EQ(r.driver->scale_loss(torch::tensor(0.5)).item<double>(), 0.5);
}

TEST(StepDriver, AnAbandonedStepLeavesNoGradient) {
  test::TempDir dir;
  Rig r(cpu_config(dir.path()));
  r.driver->begin_step(0, 0.1, nullptr);
  r.set_grad({1, 2, 3, 4});
  r.driver->abandon();
  EXPECT_TRUE(!r.w.grad().defined() || r.w.grad().abs().sum().item<double>() == 0);
  EXPECT_TRUE(torch::equal(r.w.detach(), torch::ones({4})));
}

TEST(StepDriver, ARetryIsPublishedAndTheStepsAfterItCarryTheCut) {
  test::TempDir dir;
  Config c = cpu_config(dir.path());
  c.train.grad_accum = 3;
  c.train.oom_grow_after = 1;
  Rig r(c);
  r.driver->begin_step(0, 0.1, nullptr);
  r.driver->abandon();
  r.driver->retry_smaller(0, "CUDA out of memory", 8);
  ASSERT_EQ(r.published.size(), 1u);
  EXPECT_EQ(r.published[0].value("step", 0), 1);
  EXPECT_EQ(r.published[0].value("oom", ""), "CUDA out of memory");
  EXPECT_EQ(r.published[0].value("micro_batch_effective", 0), 4);
  EXPECT_EQ(r.published[0].value("grad_accum_effective", 0), 6);

  RunMetrics metrics(r.cfg, dir.path(), "test", r.ctx, "GPU-resident");
  StepResult skipped;
  skipped.skipped = true;
  nlohmann::json row = {{"step", 1}};
  r.driver->complete_row(row, skipped, 0.1, 100, metrics);
  EXPECT_EQ(row.value("micro_batch_effective", 0), 4);
  EXPECT_TRUE(row.value("skipped", false));
  EXPECT_FALSE(row.contains("loss_scale")) << "fp32: no scale";
  nlohmann::json next = {{"step", 2}};
  r.driver->complete_row(next, StepResult{}, 0.1, 100, metrics);
  EXPECT_FALSE(next.contains("micro_batch_effective")) << "grown back after train.oom_grow_after=1 clean step";
  EXPECT_FALSE(next.contains("skipped"));
}

}  // namespace
}  // namespace tandem
