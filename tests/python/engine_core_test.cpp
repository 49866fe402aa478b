// The Python engine's step in C++ (python/engine_core.h), driven as the package's hooks drive it:
// a two-Block model trained by begin_forward / backward / end_backward / update equals a plain
// AdamW loop, resident and under the offload engine; the loop's misuses are refused with the fix;
// the out-of-memory cut, the checkpoint round trip and the stats.
#include "tandem/python/engine_core.h"

#include <gtest/gtest.h>

#include <memory>

#include "../test_util.h"

namespace tandem {
namespace {

// Two Blocks of one weight each: y = tanh(x W1) W2.
struct TinyModule {
  torch::Tensor w1, w2;
  std::shared_ptr<ModuleBlocks> blocks;

  explicit TinyModule(uint64_t seed) {
    torch::manual_seed(seed);
    w1 = (torch::randn({6, 5}) * 0.3).requires_grad_(true);
    w2 = (torch::randn({5, 3}) * 0.3).requires_grad_(true);
    blocks = std::make_shared<ModuleBlocks>(std::vector<BlockGroup>{{"layer.0", BlockKind::kLayer, {{"w1", w1}}},
                                                                    {"layer.1", BlockKind::kLayer, {{"w2", w2}}}});
  }
  // The forward as the package's hooks see it: each Block's pre-hook before its weights are used.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    blocks->before_block(0);
    const torch::Tensor h = torch::tanh(x.matmul(w1));
    blocks->before_block(1);
    return (h.matmul(w2) - y).pow(2).mean();
  }
};

Config engine_config(const std::string& dir, bool offload) {
  Config c;
  c.train.device.kind = DeviceSpec::Kind::kCpu;
  c.train.grad_clip = 0;
  c.train.run_dir = dir;
  c.monitor.enabled = false;
  c.optim.weight_decay = 0.05;
  if (offload) {
    c.offload.optimizer = OffloadTarget::kCpu;
    c.offload.update_split = "0";
  }
  return c;
}

std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({4, 6}), torch::randn({4, 3})};
}

// One step as tandem.Engine runs it: forward under the model's pre-hook, backward of the weighted
// loss, the update.
StepInfo engine_step(EngineCore& core, TinyModule& m, int step, double lr) {
  const auto [x, y] = batch(step);
  core.begin_forward(lr);
  const torch::Tensor loss = m.loss(x, y);
  (loss * core.loss_multiplier()).backward();
  core.end_backward();
  return core.update(loss.detach(), x.size(0));
}

std::vector<double> adamw_losses(const Config& c, int steps, double lr) {
  TinyModule m(7);
  torch::optim::AdamW opt({m.w1, m.w2}, torch::optim::AdamWOptions(lr)
                                            .betas({c.optim.beta1, c.optim.beta2})
                                            .eps(c.optim.eps)
                                            .weight_decay(c.optim.weight_decay));
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) {
    const auto [x, y] = batch(s);
    opt.zero_grad();
    const torch::Tensor loss = m.loss(x, y);
    loss.backward();
    opt.step();
    out.push_back(loss.item<double>());
  }
  return out;
}

void expect_adamw_steps(bool offload) {
  test::TempDir dir;
  const Config c = engine_config(dir.path(), offload);
  const std::vector<double> want = adamw_losses(c, 4, 1e-2);
  TinyModule m(7);
  EngineCore core(m.blocks, c, dir.path());
  EXPECT_EQ(core.offload(), offload);
  for (int s = 0; s < 4; ++s) {
    const StepInfo info = engine_step(core, m, s, 1e-2);
    EXPECT_EQ(info.step, s + 1);
    EXPECT_FALSE(info.skipped);
    EXPECT_EQ(info.lr, 1e-2);
    EXPECT_NEAR(info.loss, want[s], 1e-6 * std::abs(want[s])) << "step " << s + 1;
    EXPECT_GT(info.grad_norm, 0);
  }
  core.finish_run();
}

TEST(EngineCore, ResidentStepsEqualAPlainAdamWLoop) { expect_adamw_steps(false); }
TEST(EngineCore, OffloadedStepsEqualAPlainAdamWLoop) { expect_adamw_steps(true); }

TEST(EngineCore, AStepWithoutABackwardIsRefusedWithTheFix) {
  test::TempDir dir;
  TinyModule m(7);
  EngineCore core(m.blocks, engine_config(dir.path(), false), dir.path());
  const std::string err = test::error_of([&] { core.update(std::nullopt, 0); });
  EXPECT_NE(err.find("call engine.backward(loss)"), std::string::npos) << err;
}

TEST(EngineCore, AForwardPastTheStepsMicroBatchesIsRefusedUnderOffload) {
  test::TempDir dir;
  TinyModule m(7);
  EngineCore core(m.blocks, engine_config(dir.path(), true), dir.path());
  core.begin_forward(1e-2);
  const auto [x, y] = batch(0);
  (m.loss(x, y) * core.loss_multiplier()).backward();
  core.end_backward();
  const std::string err = test::error_of([&] { core.begin_forward(1e-2); });
  EXPECT_NE(err.find("call opt.step()"), std::string::npos) << err;
  core.abandon();  // the loop may go on after giving the step up
  EXPECT_EQ(engine_step(core, m, 0, 1e-2).step, 1);
}

TEST(EngineCore, GradientAccumulationWeightsEachMicroBatch) {
  test::TempDir dir;
  Config c = engine_config(dir.path(), false);
  c.train.grad_accum = 2;
  TinyModule m(7);
  EngineCore core(m.blocks, c, dir.path());
  EXPECT_EQ(core.accumulation(), 2);
  EXPECT_DOUBLE_EQ(core.loss_multiplier(), 0.5) << "one rank, fp32: 1 / accumulation";
}

TEST(EngineCore, AnOutOfMemoryRetryCutsTheMicroBatchAndGivesTheStepUp) {
  test::TempDir dir;
  TinyModule m(7);
  EngineCore core(m.blocks, engine_config(dir.path(), true), dir.path());
  core.begin_forward(1e-2);
  core.retry_smaller("injected: CUDA out of memory", 4);
  EXPECT_EQ(core.parts(4), 2);
  EXPECT_EQ(core.oom_retries(), 1);
  EXPECT_EQ(core.micro(), 0) << "the step was given up";
  const torch::Tensor w1 = m.w1.detach().clone();
  EXPECT_EQ(engine_step(core, m, 0, 1e-2).step, 1) << "the step runs again";
  core.wait();  // the CPU's update in the working weights
  EXPECT_FALSE(torch::equal(w1, m.w1.detach()));
}

TEST(EngineCore, ACheckpointRestoresTheWeightsAndTheStep) {
  test::TempDir dir;
  const Config c = engine_config(dir.path(), true);
  TinyModule m(7);
  std::string saved;
  torch::Tensor w2_saved;
  {
    EngineCore core(m.blocks, c, dir.path());
    engine_step(core, m, 0, 1e-2);
    engine_step(core, m, 1, 1e-2);
    saved = core.save(dir.path(), "");
    w2_saved = m.w2.detach().clone();
    EXPECT_EQ(nlohmann::json::parse(core.stats_json()).value("step", 0), 2) << core.stats_json();
  }
  test::TempDir other;
  TinyModule fresh(8);
  EngineCore core(fresh.blocks, engine_config(other.path(), true), other.path());
  EXPECT_EQ(core.load(saved), saved);
  EXPECT_EQ(core.step(), 2);
  EXPECT_TRUE(test::AllClose(fresh.w2.detach(), w2_saved, 0, 0));
}

}  // namespace
}  // namespace tandem
