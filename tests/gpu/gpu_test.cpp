// GPU tests: skipped where no CUDA device is visible; run by scripts/gpu-check.sh.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "tandem/core/device.h"
#include "tandem/models/model.h"
#include "tandem/models/recipe.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

/// A short quiet run of the default model on the first GPU, writing into `dir`.
Config cuda_run(const test::TempDir& dir, int64_t steps) {
  Config c;
  c.train.steps = steps;
  c.train.device.kind = DeviceSpec::Kind::kCuda;
  c.train.progress = ProgressMode::kOff;
  c.train.eval_every = 0;
  c.train.run_dir = dir.path();
  apply_preset_recipe(c);
  return c;
}

TEST(Gpu, BackendIsRegisteredAndReportsMemory) {
  REQUIRE_CUDA();
  ASSERT_NE(accelerator(), nullptr) << "CUDA visible but the CUDA backend was not linked";
  EXPECT_GE(accelerator()->device_count(), 1);
  const auto s = accelerator()->memory_stats(0);
  EXPECT_GT(s.total, 0);
  EXPECT_GT(s.free, 0);
  EXPECT_FALSE(accelerator()->device_name(0).empty());
}

TEST(Gpu, Fp32ForwardAndGradientsMatchTheCpu) {
  REQUIRE_CUDA();
  at::globalContext().setFloat32MatmulPrecision("highest");
  ModelSpec s = preset_spec("tiny");
  torch::manual_seed(21);
  Model cpu(s, false);
  torch::manual_seed(21);
  Model gpu(s, true);
  gpu.to(torch::kCUDA);
  auto tokens = torch::randint(0, 256, {4, 64}, torch::kInt64);
  auto lc = cpu.loss(cpu.forward(tokens), tokens);
  auto lg = gpu.loss(gpu.forward(tokens.cuda()), tokens.cuda());
  EXPECT_NEAR(lg.item<double>(), lc.item<double>(), 1e-4);
  lc.backward();
  lg.backward();
  auto a = cpu.hf_parameters(), b = gpu.hf_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(test::AllClose(b[i].second.grad(), a[i].second.grad(), 1e-3, 1e-6)) << a[i].first;
}

TEST(Gpu, Bf16TrainingRunLearnsAndReportsDeviceMemory) {
  REQUIRE_CUDA();
  test::TempDir dir;
  Config c = cuda_run(dir, 60);
  c.train.precision = Precision::kBf16;
  c.train.eval_every = 30;
  c.model.checkpointing = true;
  const auto s = train(c, {});
  EXPECT_LT(s.losses.back(), s.losses.front() - 2.0);
  EXPECT_GT(s.peak_device_bytes, 0);
  std::ifstream in(dir.file("metrics.jsonl"));
  std::string line;
  std::getline(in, line);
  EXPECT_TRUE(nlohmann::json::parse(line).contains("mem_device_peak_bytes"));
}

TEST(Gpu, Fp16ScalerOnCuda) {
  REQUIRE_CUDA();
  test::TempDir dir;
  Config c = cuda_run(dir, 20);
  c.train.precision = Precision::kFp16;
  c.scaler.init_scale = 1e30;
  const auto s = train(c, {});
  EXPECT_GE(s.skipped_steps, 1);
  EXPECT_LT(s.losses.back(), s.losses.front());
}

TEST(Gpu, ResumeOnCudaContinuesFromTheSavedState) {
  REQUIRE_CUDA();
  test::TempDir dir;
  Config c = cuda_run(dir, 4);
  const auto a = train(c, {});
  c.train.steps = 8;
  TrainOptions r;
  r.resume = a.last_checkpoint;
  const auto b = train(c, r);
  EXPECT_EQ(b.first_step, 4);
  EXPECT_EQ(b.losses.size(), 4u);
  EXPECT_LT(b.losses.back(), a.losses.front());
}

// A bf16 offloaded run of `steps` with deterministic kernels, half the Blocks CPU-updated through a
// host ring of `ring` slots (0: per-Block buffers), speculating as `speculate` says.
Config ring_run(const test::TempDir& dir, int64_t steps, int64_t ring, Speculation speculate) {
  Config c = cuda_run(dir, steps);
  c.train.precision = Precision::kBf16;
  c.train.deterministic = true;
  c.offload.optimizer = OffloadTarget::kCpu;
  c.offload.update_split = "0.5";
  c.offload.speculate = speculate;
  c.offload.host_ring = ring;
  return c;
}

TEST(GpuOffload, AHostRingRepeatsPerBlockBuffersBitForBitAndBf16StatesTrain) {
  REQUIRE_CUDA();
  // Streams, events, exact pinned buffers and the ring's slot reuse on a real device: with
  // deterministic kernels the ring (one, two and four slots) gives the per-block buffers' losses exactly.
  const auto run = [](int64_t ring, StateDtype states) {
    test::TempDir dir;
    Config c = ring_run(dir, 12, ring, Speculation::kNever);
    c.train.grad_accum = 2;
    c.optim.state_dtype = states;
    return train(c, {}).losses;
  };
  const auto want = run(0, StateDtype::kFp32);
  for (const int64_t ring : {1, 2, 4}) {
    const auto got = run(ring, StateDtype::kFp32);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1 << ", " << ring << " slots";
  }
  const auto bf16 = run(2, StateDtype::kBf16);
  EXPECT_LT(bf16.back(), bf16.front() - 1.0);
  EXPECT_NEAR(bf16.back(), want.back(), 0.05 * want.back());
}

// The last offload_rollbacks a run's metrics.jsonl recorded.
int64_t rollbacks_of(const std::string& run_dir) {
  std::ifstream f(run_dir + "/metrics.jsonl");
  int64_t n = -1;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("offload_rollbacks")) n = j["offload_rollbacks"].get<int64_t>();
  }
  return n;
}

// Note [Retraction] on a real device: a host ring that speculates gives the ring's bits when nothing
// clips (the same kernel on the same gradients, sooner), and a run whose clipped steps are solved
// back and redone stays with the one that waits for the norm.
TEST(GpuOffload, AHostRingSpeculatesAndSolvesClippedStepsBackOnCuda) {
  REQUIRE_CUDA();
  const auto run = [](Speculation spec, double clip, int64_t* rollbacks = nullptr) {
    test::TempDir dir;
    Config c = ring_run(dir, 10, 2, spec);
    c.train.log_every = 1;
    c.train.grad_clip = clip;
    const auto losses = train(c, {}).losses;
    if (rollbacks) *rollbacks = rollbacks_of(dir.path());
    return losses;
  };
  const auto want = run(Speculation::kNever, 0.0), got = run(Speculation::kAlways, 0.0);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
  int64_t rollbacks = 0;
  const auto exact = run(Speculation::kNever, 0.05), taken_back = run(Speculation::kAlways, 0.05, &rollbacks);
  EXPECT_GT(rollbacks, 0) << "no step clipped: the retraction went untested";
  ASSERT_EQ(taken_back.size(), exact.size());
  for (size_t i = 0; i < exact.size(); ++i) EXPECT_NEAR(taken_back[i], exact[i], 2e-3 * exact[i]) << "step " << i + 1;
  EXPECT_LT(taken_back.back(), taken_back.front());
}

// An offloaded run on the GPU with deterministic kernels, checkpointed every `every` steps; resumed
// from `resume` when given. The split is fixed (a resume repeats the run only then: Note [8-bit states]).
TrainSummary offload_run(const test::TempDir& dir, int64_t steps, const std::function<void(Config&)>& tweak,
                         int64_t every = 0, const std::string& resume = "") {
  Config c = cuda_run(dir, steps);
  c.train.precision = Precision::kBf16;
  c.train.deterministic = true;
  c.train.checkpoint_every = every;
  c.offload.optimizer = OffloadTarget::kCpu;
  c.offload.update_split = "0";
  tweak(c);
  TrainOptions o;
  o.resume = resume;
  return train(c, o);
}

// A straight run checkpointed at step 6, and the same run resumed from that checkpoint: steps 7-12 equal.
void expect_resume_repeats(const std::function<void(Config&)>& tweak) {
  test::TempDir straight_dir, resumed_dir;
  const auto straight = offload_run(straight_dir, 12, tweak, 6);
  ASSERT_EQ(straight.losses.size(), 12u);
  const auto resumed = offload_run(resumed_dir, 12, tweak, 0, straight_dir.file("checkpoints/step_00000006"));
  ASSERT_EQ(resumed.first_step, 6);
  ASSERT_EQ(resumed.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[6 + i]) << "step " << 7 + i;
}

TEST(GpuOffload, EightBitStatesResumeOnCuda) {
  REQUIRE_CUDA();
  expect_resume_repeats([](Config& c) { c.optim.state_dtype = StateDtype::kInt8; });
}

// Note [bf16 master] on a real device: bf16 masters (stochastic and Kahan) with 8-bit states
// resume bit for bit, and train.
TEST(GpuOffload, Bf16MastersResumeOnCudaAndTrain) {
  REQUIRE_CUDA();
  for (const auto rounding : {MasterRounding::kStochastic, MasterRounding::kKahan}) {
    SCOPED_TRACE(to_string(rounding));
    const auto tweak = [&](Config& c) {
      c.optim.state_dtype = StateDtype::kInt8;
      c.optim.master_dtype = MasterDtype::kBf16;
      c.optim.master_rounding = rounding;
    };
    expect_resume_repeats(tweak);
    test::TempDir dir;
    const auto run = offload_run(dir, 40, tweak);
    EXPECT_LT(run.losses.back(), run.losses.front() - 1.0);
  }
}

TEST(GpuOffload, DelayedAfterNUpdatesRunsExactFirstAndResumesAtTheSameUpdate) {
  REQUIRE_CUDA();
  // Note [Delayed update]: the first 4 updates exact (the exact run's losses, bit for bit), then the
  // one-update lag; counted on the update count, so a run resumed at update 6 with delayed_after=8
  // runs two more exact updates, as the straight run does.
  test::TempDir exact_dir, delayed_dir;
  const auto exact = offload_run(exact_dir, 10, [](Config&) {});
  const auto delayed = offload_run(delayed_dir, 10, [](Config& c) {
    c.offload.delayed_update = true;
    c.offload.delayed_after = 4;
  });
  ASSERT_EQ(delayed.losses.size(), 10u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(delayed.losses[i], exact.losses[i]) << "step " << i + 1;
  double most = 0;
  for (size_t i = 5; i < 10; ++i) most = std::max(most, std::abs(delayed.losses[i] - exact.losses[i]));
  EXPECT_GT(most, 1e-4);
  expect_resume_repeats([](Config& c) {
    c.offload.delayed_update = true;
    c.offload.delayed_after = 8;
  });
}

TEST(GpuOffload, TheDelayedUpdateLagsOnCudaAsOnTheCpu) {
  REQUIRE_CUDA();
  // Note [Delayed update]: the CPU device's engine matches the lagged-AdamW reference (the engine
  // tests); on CUDA the uploads follow the backward on streams, and through the ring. In fp32 a CUDA
  // run follows the CPU run of the same buffers to within their numerics, far closer than the exact
  // run (a lag of two updates, or weights mixed within a Block, would not). Through a ring the
  // split's solve at step 3 uploads what is pending on both devices alike.
  const auto run = [](const std::string& device, bool delayed, int64_t ring) {
    test::TempDir dir;
    Config c = cuda_run(dir, 10);
    c.train.device = DeviceSpec::parse(device, "train.device");
    c.train.deterministic = true;
    c.train.tf32 = false;
    c.train.precision = Precision::kFp32;
    c.offload.optimizer = OffloadTarget::kCpu;
    c.offload.update_split = "0";
    c.offload.host_ring = ring;
    c.offload.delayed_update = delayed;
    return train(c, {}).losses;
  };
  const auto exact = run("cuda", false, 0);
  for (const int64_t ring : {0, 4}) {
    const auto cpu = run("cpu", true, ring);
    const auto cuda = run("cuda", true, ring);
    ASSERT_EQ(cuda.size(), cpu.size());
    double most = 0, most_exact = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      most = std::max(most, std::abs(cuda[i] - cpu[i]) / cpu[i]);
      most_exact = std::max(most_exact, std::abs(exact[i] - cpu[i]) / cpu[i]);
    }
    EXPECT_LT(most, 1e-4) << ring << " ring slots";
    EXPECT_GT(most_exact, 20 * most) << ring << " ring slots";
  }
}

}  // namespace
}  // namespace tandem
