// Block placement in the offload engine (Note [Block placement]): Blocks run on the CPU from the
// ParamStore's host copies while the others run on the device. With the CPU as the device the
// mechanism is the same (host views, lazy mirrors); PlacementGpu repeats the key test on CUDA.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

#include "../test_util.h"
#include "engine_fixtures.h"
#include "tandem/core/error.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/engine/param_store.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

ModelSpec llama_spec() { return test::small_engine_spec(3); }

ModelSpec amx_moe_spec() {
  ModelSpec s = preset_spec("amx-moe-tiny");
  s.d_model = 64;
  s.d_ff = 96;
  s.vocab_size = 100;
  s.max_seq_len = 32;
  return s;
}

struct PlacedRun {
  std::vector<double> losses;
  EngineStats stats;
  bool mirrors_match = false;  // after a last all-device forward: working == staging == master
  bool staging_match = false;  // staging (the host copy host-run Blocks compute with) == master
};

// `placement(step)` gives the host flags for each step; `check(step, store)` runs after each step.
PlacedRun train(const ModelSpec& spec, int steps, torch::Device device,
                const std::function<std::vector<bool>(int)>& placement, int64_t mirror_every = 1,
                const std::function<void(int, ParamStore&)>& check = nullptr,
                torch::ScalarType compute = torch::kFloat32) {
  torch::manual_seed(7);
  auto model = build_model(spec, false);
  for (auto& b : model->buffers()) b.set_data(b.to(device));
  ParamStoreOptions so;
  so.device = device;
  so.compute_dtype = compute;
  ParamStore store(*model, so, /*gpu_blocks=*/0);
  EngineOptions eo;
  eo.adam.beta1 = 0.9;
  eo.adam.beta2 = 0.95;
  eo.grad_clip = 0.5;  // clipping: speculative rollbacks of host-run Blocks too
  eo.speculate = EngineOptions::Speculate::kAlways;
  eo.mirror_every = mirror_every;
  OffloadEngine engine(*model, store, eo);
  PlacedRun run;
  if (check) check(-1, store);  // the initial weights
  for (int step = 0; step < steps; ++step) {
    if (placement) engine.set_placement(placement(step));
    engine.begin_step(3e-3);
    engine.begin_micro(true);
    torch::manual_seed(1000 + step % 4);
    auto t = torch::randint(0, spec.vocab_size, {4, 17}, torch::kInt64).to(device);
    torch::Tensor loss;
    {
      const AutocastGuard ac(device.type(), compute == torch::kBFloat16 ? Precision::kBf16 : Precision::kFp32);
      loss = model->loss(model->forward(t.narrow(1, 0, 16)), t.narrow(1, 1, 16));
    }
    loss.backward();
    run.losses.push_back(loss.item<double>());
    engine.end_step();
    if (check) {
      engine.wait_all();
      check(step, store);
    }
  }
  engine.wait_all();
  // Every Block back on the device: the stale copies are refreshed by the forward.
  engine.set_placement(std::vector<bool>(store.blocks().size(), false));
  {
    torch::NoGradGuard ng;
    const AutocastGuard ac(device.type(), compute == torch::kBFloat16 ? Precision::kBf16 : Precision::kFp32);
    model->forward(torch::zeros({1, 4}, torch::kInt64).to(device));
  }
  engine.wait_all();
  run.mirrors_match = run.staging_match = true;
  for (auto& b : store.blocks()) {
    const auto master = b.master.cpu().to(compute);  // the copies hold the master in the compute dtype
    const bool staging = !b.staging.defined() || torch::equal(b.staging.cpu(), master);
    run.staging_match = run.staging_match && staging;
    run.mirrors_match = run.mirrors_match && staging && torch::equal(b.working.cpu(), master);
  }
  run.stats = engine.stats();
  return run;
}

std::vector<bool> flags(size_t n, std::initializer_list<size_t> host) {
  std::vector<bool> f(n, false);
  for (const size_t i : host) f[i] = true;
  return f;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << "step " << i + 1;
}

TEST(PlacementEngine, AlternatingPlacementsPerBatchGiveTheLossesOfOnePlacement) {
  for (const ModelSpec& spec : {llama_spec(), amx_moe_spec()}) {
    const size_t n = static_cast<size_t>(spec.n_layer) + 2;
    const PlacedRun one = train(spec, 10, torch::kCPU, nullptr);
    // Layers move every step, in three patterns, some twice in a row.
    const PlacedRun moving = train(spec, 10, torch::kCPU, [&](int step) {
      switch (step % 3) {
        case 0:
          return flags(n, {1, 2});
        case 1:
          return flags(n, {2, n - 2});
        default:
          return flags(n, {});
      }
    });
    expect_close(moving.losses, one.losses, 1e-5);
    EXPECT_GT(moving.stats.rollbacks, 0) << spec.name << ": clipping rolled host-run Blocks back too";
    EXPECT_GT(moving.stats.mirror_refreshes, 0) << spec.name << ": Blocks came back from the CPU";
    EXPECT_TRUE(moving.mirrors_match) << spec.name;
    EXPECT_TRUE(one.mirrors_match) << spec.name;
  }
}

TEST(PlacementEngine, AllLayersOnTheCpuFromTheStartMatchToo) {
  const ModelSpec spec = amx_moe_spec();
  const size_t n = static_cast<size_t>(spec.n_layer) + 2;
  const PlacedRun one = train(spec, 6, torch::kCPU, nullptr);
  const PlacedRun host = train(spec, 6, torch::kCPU, [&](int) { return flags(n, {1, 2, 3, 4}); });
  expect_close(host.losses, one.losses, 1e-5);
  EXPECT_TRUE(host.mirrors_match);
}

TEST(PlacementEngine, StaleMirrorsLagAtMostMirrorEveryMinusOneUpdates) {
  const ModelSpec spec = llama_spec();
  constexpr int64_t kEvery = 3;
  std::vector<std::vector<torch::Tensor>> masters;  // per update count, per Block: the master
  int64_t worst = 0;
  const auto check = [&](int step, ParamStore& store) {
    std::vector<torch::Tensor> now;
    for (auto& b : store.blocks()) now.push_back(b.master.clone());
    masters.push_back(now);
    const int64_t updates = step + 1;
    if (updates == 0) return;
    for (size_t i = 0; i < store.blocks().size(); ++i) {
      // The device copy equals the master of some update at most kEvery - 1 behind.
      int64_t lag = -1;
      for (int64_t k = updates; k >= 0 && k >= updates - kEvery; --k)
        if (torch::equal(store.blocks()[i].working, masters[static_cast<size_t>(k)][i])) {
          lag = updates - k;
          break;
        }
      ASSERT_GE(lag, 0) << "step " << step + 1 << " block " << i << ": the device copy is older than allowed";
      EXPECT_LE(lag, kEvery - 1);
      worst = std::max(worst, lag);
    }
  };
  const PlacedRun stale = train(spec, 8, torch::kCPU, nullptr, kEvery, check);
  const PlacedRun exact = train(spec, 8, torch::kCPU, nullptr);
  EXPECT_EQ(worst, kEvery - 1);
  EXPECT_EQ(stale.stats.max_mirror_lag, kEvery - 1);
  EXPECT_EQ(exact.stats.max_mirror_lag, 0);
  EXPECT_EQ(stale.losses[0], exact.losses[0]);
  EXPECT_NE(stale.losses[2], exact.losses[2]) << "step 3 computed with weights two updates old";
  EXPECT_TRUE(stale.staging_match);
  EXPECT_TRUE(exact.mirrors_match);
}

TEST(PlacementEngine, OnlyCpuUpdatedDecoderLayersMove) {
  const ModelSpec spec = llama_spec();
  torch::manual_seed(7);
  auto model = build_model(spec, false);
  ParamStore store(*model, ParamStoreOptions{}, /*gpu_blocks=*/2);  // embedding and layer 0 GPU-updated
  OffloadEngine engine(*model, store, EngineOptions{});
  const size_t n = store.blocks().size();
  EXPECT_NE(test::error_of([&] { engine.set_placement(flags(n, {0})); }).find("only decoder layers move"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { engine.set_placement(flags(n, {1})); }).find("GPU-updated"), std::string::npos);
  EXPECT_NE(test::error_of([&] { engine.set_placement(flags(n - 1, {})); }).find("names"), std::string::npos);
  // Kept CPU-updated, the split skips it.
  store.keep_cpu_updated(flags(n, {1}));
  store.set_gpu_blocks(2);
  EXPECT_EQ(store.blocks()[1].side, UpdateSide::kCpu);
  EXPECT_EQ(store.blocks()[2].side, UpdateSide::kGpu);
  EXPECT_EQ(store.gpu_blocks(), 2);
  engine.set_placement(flags(n, {1}));
  EXPECT_TRUE(store.blocks()[1].host_run);
  EXPECT_TRUE(engine.placement()[1]);
}

TEST(PlacementEngineGpu, AlternatingPlacementsMatchAllGpuOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setFloat32MatmulPrecision("highest");
  for (const ModelSpec& spec : {llama_spec(), amx_moe_spec()}) {
    const size_t n = static_cast<size_t>(spec.n_layer) + 2;
    const PlacedRun one = train(spec, 8, torch::kCUDA, nullptr);
    const PlacedRun moving = train(spec, 8, torch::kCUDA, [&](int step) {
      return step % 2 == 0 ? flags(n, {1, n - 2}) : flags(n, {2});
    });
    // CPU and GPU kernels sum in different orders: close, not equal.
    expect_close(moving.losses, one.losses, 2e-4);
    EXPECT_GT(moving.stats.mirror_refreshes, 0);
    EXPECT_TRUE(moving.mirrors_match) << spec.name;
  }
}

TEST(PlacementEngineGpu, Bf16HostBlocksRunUnderTheDevicesAutocast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const ModelSpec& spec : {llama_spec(), amx_moe_spec()}) {
    const size_t n = static_cast<size_t>(spec.n_layer) + 2;
    const auto every = [&](int step) { return step % 2 == 0 ? flags(n, {1, n - 2}) : flags(n, {2}); };
    const PlacedRun one = train(spec, 8, torch::kCUDA, nullptr, 1, nullptr, torch::kBFloat16);
    const PlacedRun moving = train(spec, 8, torch::kCUDA, every, 1, nullptr, torch::kBFloat16);
    expect_close(moving.losses, one.losses, 2e-2);  // bf16 on two kinds of processor
    EXPECT_LT(moving.losses.back(), moving.losses.front()) << spec.name;
    EXPECT_TRUE(moving.staging_match) << spec.name;
  }
}

}  // namespace
}  // namespace tandem
