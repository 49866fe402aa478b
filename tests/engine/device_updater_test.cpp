// The device side's update: on the CPU device against AdamW's first step by hand and bit for bit
// against the CPU updater (Note [One update kernel on the CPU device]); fp16 gradients widened as
// the landing buffer widens them; bf16 device states (Note [Device Adam]) as the CPU side's; nothing
// and no stamp without device-side Blocks; on a GPU the device Adam against the same hand-computed
// step and bit for bit against the CPU side.

#include "tandem/engine/device_updater.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "../test_util.h"
#include "engine_fixtures.h"
#include "tandem/engine/cpu_updater.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

constexpr double kLr = 1e-2, kB1 = 0.9, kB2 = 0.95, kEps = 1e-8, kWd = 0.1;
constexpr double kFp32Eps = std::numeric_limits<float>::epsilon();

ModelSpec small_spec() { return test::small_engine_spec(3); }

AdamWOptions adam() {
  AdamWOptions a;
  a.beta1 = kB1;
  a.beta2 = kB2;
  a.eps = kEps;
  a.weight_decay = kWd;
  return a;
}

UpdateHyper hyper() {
  UpdateHyper h;
  h.beta1 = kB1;
  h.beta2 = kB2;
  h.eps = kEps;
  h.weight_decay = kWd;
  return h;
}

struct Rig {
  std::shared_ptr<Model> model;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<StepStamps> stamps;
  std::unique_ptr<TransferStreams> streams;

  Rig(int64_t gpu_blocks, torch::ScalarType compute, torch::Device device = torch::kCPU,
      torch::ScalarType states = torch::kFloat32) {
    torch::manual_seed(7);
    model = build_model(small_spec(), false);
    ParamStoreOptions so;
    so.device = device;
    so.compute_dtype = compute;
    so.host_state_dtype = so.device_state_dtype = states;  // Note [Device Adam]
    store = std::make_unique<ParamStore>(*model, so, gpu_blocks);
    stamps = std::make_unique<StepStamps>(store->blocks().size(), device.is_cuda());
    if (device.is_cuda()) streams = std::make_unique<TransferStreams>(device, store->blocks().size());
  }
  DeviceUpdater updater(Rounding rounding = Rounding::kNearestEven) {
    UpdateHyper h = hyper();
    h.rounding = rounding;
    return DeviceUpdater(*store, adam(), h, nullptr, streams.get(), *stamps);
  }
  BlockStore& block(size_t i) { return store->blocks()[i]; }
};

torch::Tensor gradient(const BlockStore& b, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({b.shard_numel}) * 1e-2;
}

// AdamW's first update of Block b by hand, in fp64.
torch::Tensor adamw_first_master(const BlockStore& b, const torch::Tensor& w0, const torch::Tensor& grad,
                                 double scale) {
  auto wd_scale = torch::zeros({b.shard_numel}, torch::kFloat64);
  for (const auto& f : b.shard_params) wd_scale.narrow(0, f.offset, f.numel).fill_(f.weight_decay_scale);
  const auto g = grad.to(torch::kFloat64) * scale;
  const auto m = (1 - kB1) * g, v = (1 - kB2) * g * g;
  return w0.to(torch::kFloat64) * (1 - kLr * kWd * wd_scale) - kLr * (m / (1 - kB1)) / ((v / (1 - kB2)).sqrt() + kEps);
}

TEST(DeviceUpdater, OnTheCpuDeviceUpdatesTheDeviceSideAsAdamWDoes) {
  Rig rig(2, torch::kFloat32);
  std::vector<torch::Tensor> w0, g;
  for (size_t i = 0; i < 3; ++i) {
    w0.push_back(rig.block(i).master.clone());
    g.push_back(gradient(rig.block(i), 20 + i));
    rig.block(i).grad.copy_(g.back());
  }
  const auto untouched = rig.block(2).working.clone();
  rig.updater().update(kLr, 1, 0.5);
  for (size_t i = 0; i < 2; ++i) {
    auto& b = rig.block(i);
    const double atol = 4 * kFp32Eps * (w0[i].abs().max().item<double>() + kLr);
    EXPECT_TRUE(test::AllClose(b.master, adamw_first_master(b, w0[i], g[i], 0.5), 8 * kFp32Eps, atol)) << b.name;
    EXPECT_TRUE(test::AllClose(b.m, (1 - kB1) * 0.5 * g[i].to(torch::kFloat64), 8 * kFp32Eps, 0.0)) << b.name;
    EXPECT_TRUE(torch::equal(b.working, b.master)) << b.name << ": the working copy not rewritten";
  }
  EXPECT_TRUE(torch::equal(rig.block(2).master, w0[2])) << "a CPU-updated Block changed";
  EXPECT_TRUE(torch::equal(rig.block(2).working, untouched));
  EXPECT_TRUE(rig.stamps->gpu0.set && rig.stamps->gpu1.set);
  EXPECT_GE(rig.stamps->device_update_s(), 0.0);
}

// Blocks 0 and 1 on the device side of `device`, on the CPU side of `cpu`; bf16 weights and
// gradients, clipped scale, two updates: the same bits on either side.
void expect_either_side_the_same(Rig& device, Rig& cpu, Rounding rounding) {
  CpuUpdaterOptions o;
  o.hyper = hyper();
  o.hyper.rounding = rounding;
  CpuUpdater updater(*cpu.store, o, cpu.streams.get(), *cpu.stamps);
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<CpuUpdateJob> jobs;
    for (size_t i = 0; i < 2; ++i) {
      const auto g = gradient(device.block(i), 30 + 10 * step + i).to(torch::kBFloat16);
      device.block(i).grad.copy_(g);
      cpu.block(i).landing.copy_(g);
      CpuUpdateJob j;
      j.block = i;
      j.grad_scale = 0.3;
      j.lr = kLr;
      j.step = step;
      jobs.push_back(j);
    }
    device.updater(rounding).update(kLr, step, 0.3);
    updater.enqueue(jobs);
    updater.wait_idle();
  }
  if (torch::cuda::is_available()) torch::cuda::synchronize();
  for (size_t i = 0; i < 2; ++i) {
    auto& d = device.block(i);
    EXPECT_EQ(d.m.scalar_type(), cpu.block(i).m.scalar_type()) << d.name;
    EXPECT_TRUE(torch::equal(d.master.cpu(), cpu.block(i).master)) << d.name;
    EXPECT_TRUE(torch::equal(d.m.cpu(), cpu.block(i).m)) << d.name;
    EXPECT_TRUE(torch::equal(d.v.cpu(), cpu.block(i).v)) << d.name;
    EXPECT_TRUE(torch::equal(d.working.cpu(), cpu.block(i).working.cpu())) << d.name;
  }
}

TEST(DeviceUpdater, OnTheCpuDeviceEitherSideGivesTheSameBits) {
  // Note [One update kernel on the CPU device].
  Rig device(2, torch::kBFloat16), cpu(0, torch::kBFloat16);
  expect_either_side_the_same(device, cpu, Rounding::kNearestEven);
}

TEST(DeviceUpdater, Bf16DeviceStatesOnTheCpuDeviceGiveTheCpuSidesBits) {
  // Note [Device Adam]: bf16 states on both sides, rounded to nearest and stochastically.
  for (const auto rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
    Rig device(2, torch::kBFloat16, torch::kCPU, torch::kBFloat16), cpu(0, torch::kBFloat16, torch::kCPU, torch::kBFloat16);
    ASSERT_EQ(device.block(0).m.scalar_type(), torch::kBFloat16);
    expect_either_side_the_same(device, cpu, rounding);
  }
}

TEST(DeviceUpdaterGpu, TheDeviceKernelGivesTheCpuSidesBits) {
  // Note [Device Adam]: the device side on a GPU, fp32 and bf16 states, against the CPU side.
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto states : {torch::kFloat32, torch::kBFloat16})
    for (const auto rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
      if (states == torch::kFloat32 && rounding == Rounding::kStochastic) continue;
      Rig device(2, torch::kBFloat16, torch::Device(torch::kCUDA, 0), states),
          cpu(0, torch::kBFloat16, torch::Device(torch::kCUDA, 0), states);
      expect_either_side_the_same(device, cpu, rounding);
    }
}

TEST(DeviceUpdater, Fp16GradientsAreWidenedAsTheLandingBufferWidensThem) {
  Rig half(1, torch::kHalf), full(1, torch::kFloat32);
  const auto g = gradient(half.block(0), 40).to(torch::kHalf);
  half.block(0).grad.copy_(g);
  full.block(0).grad.copy_(g.to(torch::kFloat32));
  half.updater().update(kLr, 1, 1.0);
  full.updater().update(kLr, 1, 1.0);
  EXPECT_TRUE(torch::equal(half.block(0).master, full.block(0).master));
  EXPECT_TRUE(torch::equal(half.block(0).v, full.block(0).v));
  EXPECT_TRUE(torch::equal(half.block(0).working, full.block(0).master.to(torch::kHalf)));
}

TEST(DeviceUpdater, WithoutDeviceSideBlocksNothingHappens) {
  Rig rig(0, torch::kFloat32);
  const auto w0 = rig.block(0).master.clone();
  rig.block(0).grad.fill_(1.0);
  rig.updater().update(kLr, 1, 1.0);
  EXPECT_TRUE(torch::equal(rig.block(0).master, w0));
  EXPECT_FALSE(rig.stamps->gpu0.set);
  EXPECT_FALSE(rig.stamps->gpu1.set);
}

TEST(DeviceUpdaterGpu, TheDeviceAdamUpdatesAsAdamWDoes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Rig rig(2, torch::kBFloat16, torch::Device(torch::kCUDA, 0));
  std::vector<torch::Tensor> w0, g;
  for (size_t i = 0; i < 2; ++i) {
    w0.push_back(rig.block(i).master.cpu());
    g.push_back(gradient(rig.block(i), 50 + i).to(torch::kBFloat16));
    rig.block(i).grad.copy_(g.back());
  }
  rig.updater().update(kLr, 1, 0.5);
  torch::cuda::synchronize();
  for (size_t i = 0; i < 2; ++i) {
    auto& b = rig.block(i);
    const double atol = 4 * kFp32Eps * (w0[i].abs().max().item<double>() + kLr);
    EXPECT_TRUE(test::AllClose(b.master.cpu(), adamw_first_master(b, w0[i], g[i], 0.5), 8 * kFp32Eps, atol)) << b.name;
    EXPECT_TRUE(torch::equal(b.working.cpu(), b.master.cpu().to(torch::kBFloat16))) << b.name;
  }
  EXPECT_GE(rig.stamps->device_update_s(), 0.0);
}

}  // namespace
}  // namespace tandem
