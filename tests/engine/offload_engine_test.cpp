// The offload engine with the CPU as the device against a plain torch::optim::AdamW loop: the
// same losses step by step (fp32), with clipping (speculative rollbacks), gradient accumulation,
// a GPU-updated prefix, the non-finite skip, the host ring, the delayed update, the solved split
// and the trace. The ParamStore's own tests (layout, migration) are in param_store_test.cpp.

#include "tandem/engine/offload_engine.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <set>

#include "../test_util.h"
#include "engine_fixtures.h"
#include "tandem/core/fs.h"
#include "tandem/core/strings.h"
#include "tandem/engine/param_store.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"
#include "tandem/optim/cpu_optimizer.h"

namespace tandem {
namespace {

ModelSpec small_spec() { return test::small_engine_spec(3); }

struct Batch2 {
  torch::Tensor in, tgt;
};
Batch2 batch(int64_t step, int64_t micro, const ModelSpec& s) {
  torch::manual_seed(1000 + (step % 4) * 7 + micro);  // four batches in turn: learnable
  auto t = torch::randint(0, s.vocab_size, {4, 17}, torch::kInt64);
  return {t.narrow(1, 0, 16), t.narrow(1, 1, 16)};
}

constexpr double kLr = 3e-3, kB1 = 0.9, kB2 = 0.95, kEps = 1e-8, kWd = 0.1;

// The reference: LibTorch's AdamW with FusedAdamW's groups (decay on matrices only), clipping
// by torch::nn::utils::clip_grad_norm_, accumulation in .grad.
// With `delayed`, the gradient of step s (0-based) is taken at the weights after step s-2's update
// (Note [Delayed update]) once s > exact_first (the updates before run exact): a second model holds
// the lagging weights.
std::vector<double> reference_losses(int steps, int accum, double clip, bool delayed = false, int exact_first = 0) {
  const auto spec = small_spec();
  torch::manual_seed(7);
  auto model = build_model(spec, false);
  torch::manual_seed(7);
  auto lagging = build_model(spec, false);
  std::vector<std::vector<torch::Tensor>> history;  // weights after each update
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& [n, p] : model->hf_parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(kLr).betas({kB1, kB2}).eps(kEps).weight_decay(kWd)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(kLr).betas({kB1, kB2}).eps(kEps).weight_decay(0.0)));
  torch::optim::AdamW opt(groups);
  std::vector<double> losses;
  const auto snapshot = [&] {
    std::vector<torch::Tensor> w;
    for (auto& p : model->parameters()) w.push_back(p.detach().clone());
    return w;
  };
  history.push_back(snapshot());
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    double sum = 0;
    Model& fwd = delayed ? *lagging : *model;
    if (delayed) {
      torch::NoGradGuard ng;
      const auto& w = history[static_cast<size_t>(step <= exact_first ? step : step - 1)];
      auto ps = lagging->parameters();
      for (size_t i = 0; i < ps.size(); ++i) {
        ps[i].copy_(w[i]);
        ps[i].mutable_grad() = torch::Tensor();
      }
    }
    for (int micro = 0; micro < accum; ++micro) {
      auto b = batch(step, micro, spec);
      auto loss = fwd.loss(fwd.forward(b.in), b.tgt);
      (loss / double(accum)).backward();
      sum += loss.item<double>();
    }
    if (delayed) {
      auto ps = lagging->parameters(), qs = model->parameters();
      for (size_t i = 0; i < ps.size(); ++i) qs[i].mutable_grad() = ps[i].grad().clone();
    }
    if (clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), clip);
    opt.step();
    history.push_back(snapshot());
    losses.push_back(sum / accum);
  }
  return losses;
}

struct EngineRun {
  std::vector<double> losses;
  EngineStats stats;
  SplitStatus split;
  int64_t gpu_blocks = 0;
};

EngineRun engine_losses(int steps, int accum, double clip, int64_t gpu_blocks,
                        torch::ScalarType compute = torch::kFloat32,
                        EngineOptions::Speculate speculate = EngineOptions::Speculate::kAlways,
                        const std::function<void(EngineOptions&)>& tweak = nullptr,
                        const std::function<void(ParamStoreOptions&)>& store_tweak = nullptr) {
  const auto spec = small_spec();
  torch::manual_seed(7);
  auto model = build_model(spec, false);
  ParamStoreOptions so;
  so.compute_dtype = compute;
  so.undo = speculate != EngineOptions::Speculate::kNever;
  if (store_tweak) store_tweak(so);
  ParamStore store(*model, so, gpu_blocks);
  EngineOptions eo;
  eo.adam.beta1 = kB1;
  eo.adam.beta2 = kB2;
  eo.adam.eps = kEps;
  eo.adam.weight_decay = kWd;
  eo.grad_clip = clip;
  eo.speculate = speculate;
  if (tweak) tweak(eo);
  OffloadEngine engine(*model, store, eo);
  EngineRun run;
  for (int step = 0; step < steps; ++step) {
    engine.begin_step(kLr);
    double sum = 0;
    for (int micro = 0; micro < accum; ++micro) {
      engine.begin_micro(micro == accum - 1);
      auto b = batch(step, micro, spec);
      torch::Tensor loss;
      {
        // bf16 weights run under autocast, as the trainer runs them; fp32 ones without.
        const bool ac = compute != torch::kFloat32;
        at::autocast::set_autocast_enabled(at::kCPU, ac);
        at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
        loss = model->loss(model->forward(b.in), b.tgt);
        at::autocast::set_autocast_enabled(at::kCPU, false);
        if (ac) at::autocast::clear_cache();
      }
      (loss.to(torch::kFloat32) / double(accum)).backward();
      sum += loss.item<double>();
    }
    engine.end_step();
    run.losses.push_back(sum / accum);
  }
  engine.wait_all();
  run.stats = engine.stats();
  run.split = engine.split();
  run.gpu_blocks = store.gpu_blocks();
  return run;
}

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << "step " << i + 1;
}

TEST(OffloadEngine, MatchesAPlainAdamWLoopWithClippingRollbacks) {
  const auto want = reference_losses(50, 1, 1.0);
  const auto got = engine_losses(50, 1, 1.0, 0);
  // fp32 throughout; the CPU kernel and LibTorch's AdamW round differently in the last bit.
  expect_same_losses(got.losses, want, 1e-5);
  EXPECT_EQ(got.stats.steps, 50);
  EXPECT_GT(got.stats.rollbacks, 0) << "no step was clipped: the rollback path went untested";
  EXPECT_GT(got.losses.front(), got.losses.back() + 0.5);
}

TEST(OffloadEngine, GradientAccumulationAndAGpuUpdatedPrefixMatchToo) {
  const auto want = reference_losses(20, 2, 1.0);
  expect_same_losses(engine_losses(20, 2, 1.0, 0).losses, want, 1e-5);
  // Blocks [0, 2) (embedding and the first layer) updated on the device side (on the CPU device by
  // the CPU kernel on the compute thread, Note [One update kernel on the CPU device]).
  expect_same_losses(engine_losses(20, 2, 1.0, 2).losses, want, 1e-5);
  // Everything "on the GPU": no CPU Block, no speculation.
  const auto all = engine_losses(20, 2, 1.0, 5);
  expect_same_losses(all.losses, want, 1e-5);
  EXPECT_EQ(all.stats.rollbacks, 0);
}

TEST(OffloadEngine, WithoutSpeculationTheSameLossesAndNoRollbacks) {
  const auto want = reference_losses(20, 2, 1.0);
  const auto got = engine_losses(20, 2, 1.0, 1, torch::kFloat32, EngineOptions::Speculate::kNever);
  expect_same_losses(got.losses, want, 1e-5);
  EXPECT_EQ(got.stats.rollbacks, 0);
  EXPECT_EQ(got.stats.speculative_steps, 0);
}

TEST(OffloadEngine, AutoSpeculatesOnlyAfterARunOfUnclippedSteps) {
  // Clipping at 1.0 trips in the first steps of this model; with no clipping every step is clean.
  const auto clipped = engine_losses(12, 1, 1e-3, 0, torch::kFloat32, EngineOptions::Speculate::kAuto);
  EXPECT_EQ(clipped.stats.speculative_steps, 0);
  EXPECT_EQ(clipped.stats.rollbacks, 0);
  expect_same_losses(clipped.losses, reference_losses(12, 1, 1e-3), 1e-5);
  const auto clean = engine_losses(12, 1, 0.0, 0, torch::kFloat32, EngineOptions::Speculate::kAuto);
  EXPECT_EQ(clean.stats.speculative_steps, 4);  // steps 9 .. 12, after 8 clean ones
  EXPECT_EQ(clean.stats.rollbacks, 0);
  expect_same_losses(clean.losses, reference_losses(12, 1, 0.0), 1e-5);
}

TEST(OffloadEngine, Bf16WorkingCopyStaysCloseToFp32) {
  // bf16 weights and gradients on the "device", fp32 masters and states: within bf16 resolution.
  const auto want = reference_losses(20, 1, 1.0);
  const auto got = engine_losses(20, 1, 1.0, 0, torch::kBFloat16);
  expect_same_losses(got.losses, want, 3e-2);
}

TEST(OffloadEngine, NonFiniteGradientsSkipTheStepAndRestoreEverything) {
  using S = EngineOptions::Speculate;
  for (const auto& [mode, ring] :
       std::vector<std::pair<S, int64_t>>{{S::kAlways, 0}, {S::kNever, 0}, {S::kNever, 2}, {S::kAlways, 2}}) {
    const bool spec = mode == EngineOptions::Speculate::kAlways;
    const auto spec_ = small_spec();
    torch::manual_seed(7);
    auto model = build_model(spec_, false);
    ParamStoreOptions so;
    so.undo = spec && ring == 0;  // a ring's speculation solves its updates back (Note [Retraction])
    so.ring_slots = ring;
    ParamStore store(*model, so, 1);
    EngineOptions eo;
    eo.speculate = mode;
    OffloadEngine engine(*model, store, eo);
    const auto run_step = [&](int step, bool poison) {
      engine.begin_step(kLr);
      engine.begin_micro(true);
      auto b = batch(step, 0, spec_);
      auto loss = model->loss(model->forward(b.in), b.tgt);
      if (poison) loss = loss * std::numeric_limits<double>::quiet_NaN();
      loss.backward();
      return engine.end_step();
    };
    run_step(0, false);
    engine.wait_all();
    std::vector<torch::Tensor> before;
    for (auto& b : store.blocks())
      for (auto* t : {&b.master, &b.m, &b.v, &b.working}) before.push_back(t->clone());
    const auto out = run_step(1, true);
    engine.wait_all();
    EXPECT_TRUE(out.skipped);
    // Speculative CPU updates had run on NaN gradients and are undone; otherwise none ran.
    EXPECT_EQ(out.rolled_back, spec);
    EXPECT_EQ(engine.stats().skipped, 1);
    EXPECT_EQ(engine.stats().steps, 1);
    size_t k = 0;
    for (auto& b : store.blocks())
      for (auto* t : {&b.master, &b.m, &b.v, &b.working})
        EXPECT_TRUE(torch::equal(*t, before[k++])) << b.name << " changed in a skipped step, speculate " << spec;
    // And training goes on from there.
    EXPECT_FALSE(run_step(2, false).skipped);
    EXPECT_EQ(engine.stats().steps, 2);
  }
}

TEST(OffloadEngine, AHostRingGivesTheSameBitsAsPerBlockBuffers) {
  // Note [Host ring]: the same kernel on the same data, so the losses are equal, not close; with
  // one slot (no prefetch), two, and more slots than CPU-updated Blocks; fp32 and bf16 weights; a
  // GPU-updated prefix; gradient accumulation and clipping.
  for (const auto compute : {torch::kFloat32, torch::kBFloat16}) {
    const auto want = engine_losses(12, 2, 1.0, 1, compute, EngineOptions::Speculate::kNever);
    for (const int64_t slots : {1, 2, 8}) {
      const auto got = engine_losses(12, 2, 1.0, 1, compute, EngineOptions::Speculate::kNever, nullptr,
                                     [&](ParamStoreOptions& o) { o.ring_slots = slots; });
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (size_t i = 0; i < want.losses.size(); ++i)
        EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i + 1 << ", " << slots << " slots, " << compute;
    }
  }
}

// Note [Retraction]: speculation through a ring keeps no undo log. Steps that do not clip give the
// per-Block buffers' bits (the same kernel on the same gradients, only sooner); steps that clip are
// solved back and redone, within fp32 rounding of the plain loop, with gradient accumulation.
TEST(OffloadEngine, AHostRingSpeculatesAndSolvesClippedStepsBack) {
  using S = EngineOptions::Speculate;
  const auto ring = [](ParamStoreOptions& o) {
    o.undo = false;
    o.ring_slots = 2;
  };
  const auto want = engine_losses(12, 1, 0.0, 1, torch::kFloat32, S::kNever);
  const auto got = engine_losses(12, 1, 0.0, 1, torch::kFloat32, S::kAlways, nullptr, ring);
  EXPECT_EQ(got.stats.speculative_steps, 12);
  EXPECT_EQ(got.stats.rollbacks, 0);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i + 1;

  const auto clipped = engine_losses(30, 2, 1.0, 0, torch::kFloat32, S::kAlways, nullptr, ring);
  expect_same_losses(clipped.losses, reference_losses(30, 2, 1.0), 1e-5);
  EXPECT_GT(clipped.stats.rollbacks, 0) << "no step was clipped: the retraction went untested";
  EXPECT_GT(clipped.losses.front(), clipped.losses.back() + 0.5);
}

// Note [NVMe tier]: the same kernel on the same states, read from and written to files, so the
// losses are equal, not close: fp32, bf16 and 8-bit states; some and all CPU-updated Blocks on the
// tier; with a host ring; and the solver moving tier Blocks to the device side and back (their
// states come off the files and, moved back, go to them again).
TEST(OffloadEngine, TheNvmeTierGivesTheSameBitsAsHostStates) {
  test::TempDir tmp;
  for (const auto state : {torch::kFloat32, torch::kBFloat16, torch::kInt8}) {
    struct Case {
      int64_t nvme_blocks, ring_slots;
      bool solve;
    };
    for (const Case c : {Case{2, 0, false}, Case{5, 0, false}, Case{3, 2, false}, Case{3, 0, true}}) {
      SCOPED_TRACE(strprintf("%s states, %lld blocks on the tier, ring %lld%s", c10::toString(state),
                             (long long)c.nvme_blocks, (long long)c.ring_slots, c.solve ? ", solved split" : ""));
      const auto solve = [&](EngineOptions& o) {
        if (!c.solve) return;
        o.solve_split = true;  // 1 device-side Block, then 4 from step 3 (two of them from the tier)
        o.min_gpu_blocks = o.max_gpu_blocks = 4;
        o.first_solve_step = 3;
      };
      const auto run = [&](bool tier) {
        return engine_losses(10, 2, 1.0, 1, torch::kFloat32, EngineOptions::Speculate::kNever, solve,
                             [&](ParamStoreOptions& o) {
                               o.host_state_dtype = state;
                               o.ring_slots = c.ring_slots;
                               if (!tier) return;
                               o.nvme_path = tmp.file("nvme");
                               o.nvme_blocks = c.nvme_blocks;
                             });
      };
      // The same run with the states in memory (8-bit states moved to the device side become fp32
      // there, so a solved split is compared with the same solve).
      const auto want = run(false), got = run(true);
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i + 1;
      EXPECT_GT(got.stats.nvme_read_bytes, 0);
      EXPECT_GT(got.stats.nvme_written_bytes, 0);
      EXPECT_EQ(want.stats.nvme_read_bytes, 0);
      if (c.solve) {
        EXPECT_EQ(got.gpu_blocks, 4);
      }
    }
  }
  // Speculation keeps an undo log, which the tier does not: refused.
  auto model = build_model(small_spec(), false);
  ParamStoreOptions so;
  so.undo = false;
  so.nvme_path = tmp.file("nvme");
  so.nvme_blocks = 1;
  ParamStore store(*model, so, 0);
  EngineOptions eo;
  eo.speculate = EngineOptions::Speculate::kAuto;
  EXPECT_NE(test::error_of([&] { OffloadEngine e(*model, store, eo); }).find("offload.nvme_path"), std::string::npos);
}

// A plain loop over the CPU optimizer with bf16 states: the engine's CPU side must do the same.
std::vector<double> cpu_optimizer_losses(int steps, double clip, Rounding rounding) {
  const auto spec = small_spec();
  torch::manual_seed(7);
  auto model = build_model(spec, false);
  CpuOptimizerOptions o;
  o.hyper.rule = UpdateRule::kAdamW;
  o.hyper.beta1 = kB1;
  o.hyper.beta2 = kB2;
  o.hyper.eps = kEps;
  o.hyper.weight_decay = kWd;
  o.hyper.rounding = rounding;
  o.state_dtype = Dtype::kBF16;
  CpuOptimizer opt(model->hf_parameters(), o);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    auto b = batch(step, 0, spec);
    auto loss = model->loss(model->forward(b.in), b.tgt);
    loss.backward();
    if (clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), clip);
    opt.step(kLr);
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(OffloadEngine, Bf16HostStatesMatchTheCpuOptimizerWithBf16States) {
  const auto bf16_states = [](ParamStoreOptions& o) { o.host_state_dtype = torch::kBFloat16; };
  for (const auto rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
    SCOPED_TRACE(rounding == Rounding::kNearestEven ? "nearest" : "stochastic");
    const auto with = [&](EngineOptions& e) { e.state_rounding = rounding; };
    // Without clipping both run the same kernel on the same gradients: the same bits.
    const auto plain =
        engine_losses(30, 1, 0.0, 0, torch::kFloat32, EngineOptions::Speculate::kAlways, with, bf16_states);
    expect_same_losses(plain.losses, cpu_optimizer_losses(30, 0.0, rounding), 0.0);
    // With clipping (speculative updates rolled back through a bf16 undo log): the clip
    // coefficient is rounded once by the engine and by torch's clip_grad_norm_ each, and a last-bit
    // difference can flip a bf16 state's rounding, so close rather than equal.
    const auto got =
        engine_losses(30, 1, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kAlways, with, bf16_states);
    const auto want = cpu_optimizer_losses(30, 1.0, rounding);
    expect_same_losses(got.losses, want, 1e-4);
    EXPECT_GT(got.stats.rollbacks, 0);
    // And the equality above is not one of fp32 states: those part from bf16 ones.
    const auto fp32 = engine_losses(30, 1, 0.0, 0);
    double most = 0;
    for (size_t i = 0; i < fp32.losses.size(); ++i)
      most = std::max(most, std::abs(fp32.losses[i] - plain.losses[i]) / fp32.losses[i]);
    EXPECT_GT(most, 1e-5);
  }
}

// 8-bit host states (Note [8-bit states]): 40 steps with clipping (speculative updates rolled back
// through the 8-bit undo log) stay within 1 % of fp32 states' losses without being the same; and a
// split with GPU-updated Blocks (fp32 states there) runs beside them.
TEST(OffloadEngine, EightBitHostStatesTrackFp32States) {
  const auto int8_states = [](ParamStoreOptions& o) { o.host_state_dtype = torch::kInt8; };
  const auto fp32 = engine_losses(40, 1, 1.0, 0);
  const auto q8 = engine_losses(40, 1, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kAlways, nullptr, int8_states);
  ASSERT_EQ(q8.losses.size(), fp32.losses.size());
  double most = 0;
  for (size_t i = 0; i < q8.losses.size(); ++i)
    most = std::max(most, std::abs(q8.losses[i] - fp32.losses[i]) / fp32.losses[i]);
  EXPECT_GT(most, 1e-6) << "8-bit states gave fp32's losses: they were not quantised";
  EXPECT_LT(most, 1e-2);
  EXPECT_GT(q8.stats.rollbacks, 0);
  EXPECT_LT(q8.losses.back(), q8.losses.front());
  const auto split = engine_losses(40, 1, 1.0, 2, torch::kFloat32, EngineOptions::Speculate::kAlways, nullptr, int8_states);
  for (size_t i = 0; i < split.losses.size(); ++i)
    EXPECT_NEAR(split.losses[i], fp32.losses[i], 1e-2 * fp32.losses[i]) << "step " << i + 1;
}

// A bf16 master (Note [bf16 master]): 40 steps with clipping (speculative updates rolled back
// through the bf16 undo log, the compensation's too) stay within 2 % of the fp32 master's losses
// without being the same (this small model at its learning rate parts by 0.5 % with 8-bit states
// alone); Kahan's compensation stays closer than stochastic rounding; and with 8-bit states and a
// split with GPU-updated Blocks (fp32 masters there) beside them.
TEST(OffloadEngine, ABf16MasterTracksTheFp32Master) {
  // bf16 compute, as on a GPU: the working weights are bf16 whatever the master, so what differs is
  // only what the master keeps of each update.
  const auto bf16 = torch::kBFloat16;
  const auto fp32 = engine_losses(40, 1, 1.0, 0, bf16);
  const auto apart = [&](const std::vector<double>& got) {
    EXPECT_EQ(got.size(), fp32.losses.size());
    double most = 0;
    for (size_t i = 0; i < got.size() && i < fp32.losses.size(); ++i)
      most = std::max(most, std::abs(got[i] - fp32.losses[i]) / fp32.losses[i]);
    return most;
  };
  std::vector<double> most;
  for (const auto kind : {MasterKind::kBf16Stochastic, MasterKind::kBf16Kahan}) {
    SCOPED_TRACE(kind == MasterKind::kBf16Kahan ? "kahan" : "stochastic");
    const auto run = engine_losses(40, 1, 1.0, 0, bf16, EngineOptions::Speculate::kAlways, nullptr,
                                   [&](ParamStoreOptions& o) { o.host_master = kind; });
    most.push_back(apart(run.losses));
    EXPECT_GT(most.back(), 1e-7) << "a bf16 master gave the fp32 master's losses: it was not rounded";
    EXPECT_LT(most.back(), 2e-2);
    EXPECT_GT(run.stats.rollbacks, 0);
    EXPECT_LT(run.losses.back(), run.losses.front());
  }
  EXPECT_LT(most[1], most[0]) << "Kahan's compensation should keep closer to fp32 than stochastic rounding";
  const auto split = engine_losses(40, 1, 1.0, 2, bf16, EngineOptions::Speculate::kAlways, nullptr,
                                   [](ParamStoreOptions& o) {
                                     o.host_master = MasterKind::kBf16Stochastic;
                                     o.host_state_dtype = torch::kInt8;
                                   });
  EXPECT_LT(apart(split.losses), 2e-2);
}

TEST(OffloadEngine, DelayedUpdateLagsTheCpuBlocksByExactlyOneUpdate) {
  // The reference takes step s's gradient at the weights after update s-2, clipping included.
  const auto want = reference_losses(20, 2, 1.0, /*delayed=*/true);
  const auto got = engine_losses(20, 2, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kAuto,
                                 [](EngineOptions& o) { o.delayed = true; });
  expect_same_losses(got.losses, want, 1e-5);
  EXPECT_EQ(got.stats.delayed_steps, 20);
  EXPECT_EQ(got.stats.speculative_steps, 0);
  // And it is not the exact engine: the lag changes the losses.
  const auto exact = reference_losses(20, 2, 1.0);
  double most = 0;
  for (size_t i = 0; i < exact.size(); ++i) most = std::max(most, std::abs(exact[i] - got.losses[i]) / exact[i]);
  EXPECT_GT(most, 1e-3);
}

TEST(OffloadEngine, DelayedAfterNUpdatesRunsExactThenLagsByOneUpdate) {
  // offload.delayed_after=5: updates 1..5 exact (speculating as the exact engine does), then the
  // lag of one update from step 7 on (step 6 still sees update 5, the last exact one).
  const auto want = reference_losses(14, 2, 1.0, /*delayed=*/true, /*exact_first=*/5);
  const auto got = engine_losses(14, 2, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kAuto,
                                 [](EngineOptions& o) {
                                   o.delayed = true;
                                   o.delayed_after = 5;
                                 });
  expect_same_losses(got.losses, want, 1e-5);
  EXPECT_EQ(got.stats.delayed_steps, 9);
  const auto exact = reference_losses(14, 2, 1.0);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got.losses[i], exact[i], 1e-5 * exact[i]) << "step " << i + 1;
  EXPECT_GT(std::abs(got.losses[7] - exact[7]), 1e-4 * exact[7]);
}

TEST(OffloadEngine, ADelayedUpdateThroughAHostRingGivesTheSameBitsAsPerBlockBuffers) {
  // Note [Delayed host ring]: every Block CPU-updated, the embedding tied to the head (reached by
  // the head's backward, completed last, so it holds its slot through the backward); the same
  // kernel on the same gradients uploaded at the same point: equal losses, and the lagged-AdamW
  // reference within 1e-5.
  const auto delayed = [](EngineOptions& o) { o.delayed = true; };
  ASSERT_TRUE(small_spec().tie_embeddings);
  const auto want = engine_losses(16, 1, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kNever, delayed);
  expect_same_losses(want.losses, reference_losses(16, 1, 1.0, /*delayed=*/true), 1e-5);
  for (const int64_t slots : {3, 4, 8}) {
    const auto got = engine_losses(16, 1, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kNever, delayed,
                                   [&](ParamStoreOptions& o) { o.ring_slots = slots; });
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (size_t i = 0; i < want.losses.size(); ++i)
      EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i + 1 << ", " << slots << " slots";
    EXPECT_EQ(got.stats.delayed_steps, 16);
  }
  // Two slots could wait on each other: refused with the fix.
  const auto spec = small_spec();
  auto model = build_model(spec, false);
  ParamStoreOptions so;
  so.undo = false;
  so.ring_slots = 2;
  ParamStore store(*model, so, 0);
  EngineOptions eo;
  eo.delayed = true;
  EXPECT_NE(test::error_of([&] { OffloadEngine e(*model, store, eo); }).find("offload.host_ring=4"), std::string::npos);
  // Accumulation would wait on slots only the last micro-batch frees: refused at the first one.
  ParamStoreOptions so3 = so;
  so3.ring_slots = 3;
  torch::manual_seed(7);
  auto model3 = build_model(spec, false);
  ParamStore store3(*model3, so3, 0);
  OffloadEngine e3(*model3, store3, eo);
  e3.begin_step(kLr);
  EXPECT_NE(test::error_of([&] { e3.begin_micro(false); }).find("train.grad_accum=1"), std::string::npos);
}

TEST(OffloadEngine, TheSolvedSplitMovesBlocksBetweenStepsWithoutChangingTheResult) {
  // The memory range [2, 2] forces the solver to move the embedding and layer 0 to the device side
  // at step 3; the run must still match the plain AdamW loop.
  const auto want = reference_losses(10, 1, 1.0);
  const auto got =
      engine_losses(10, 1, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kAlways, [](EngineOptions& o) {
        o.solve_split = true;
        o.min_gpu_blocks = o.max_gpu_blocks = 2;
        o.first_solve_step = 3;
      });
  expect_same_losses(got.losses, want, 1e-5);
  EXPECT_EQ(got.gpu_blocks, 2);
  EXPECT_TRUE(got.split.solved);
  EXPECT_NEAR(got.split.k, 2.0 / 5.0, 1e-12);
  EXPECT_GT(got.split.alpha, 0.0);
  EXPECT_GT(got.split.predicted_step_s, 0.0);
  EXPECT_GT(got.split.measured_step_s, 0.0);
}

TEST(OffloadEngine, ASolveKeepsDelayedWeightsPendingAndADelayedRingGetsThrough) {
  // Note [Delayed update]: a solve that moves nothing leaves the lag as it is (the lagged reference
  // holds through the solve at step 3); through a host ring the solve uploads what is pending, since
  // the updater waits for the slots those uploads free (it must not wait on itself).
  const auto solve_at_3 = [](EngineOptions& o) {
    o.delayed = true;
    o.solve_split = true;
    o.fixed_k = 0.0;
    o.first_solve_step = 3;
  };
  const auto per_block = engine_losses(8, 1, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kNever, solve_at_3);
  expect_same_losses(per_block.losses, reference_losses(8, 1, 1.0, /*delayed=*/true), 1e-5);
  EXPECT_TRUE(per_block.split.solved);
  const auto ring = engine_losses(8, 1, 1.0, 0, torch::kFloat32, EngineOptions::Speculate::kNever, solve_at_3,
                                  [](ParamStoreOptions& o) { o.ring_slots = 3; });
  EXPECT_TRUE(ring.split.solved);
  EXPECT_EQ(ring.stats.delayed_steps, 8);
  EXPECT_LT(ring.losses.back(), ring.losses.front());
}

TEST(OffloadEngine, OnTheCpuDeviceTheSplitChangesNoBit) {
  // Note [One update kernel on the CPU device]: the split is solved from measured times, so two runs
  // (or a run and its resumption) may update different Blocks on the device side; that must not
  // change a bit. Every split, fixed or moved by the solver at step 3, against all Blocks on the CPU
  // side; fp32 and bf16 weights, accumulation, clipping (speculative rollbacks) and without speculation.
  using S = EngineOptions::Speculate;
  for (const auto compute : {torch::kFloat32, torch::kBFloat16}) {
    for (const auto speculate : {S::kAlways, S::kNever}) {
      SCOPED_TRACE(std::string(compute == torch::kFloat32 ? "fp32" : "bf16") +
                   (speculate == S::kAlways ? ", speculating" : ", after the norm"));
      const auto want = engine_losses(12, 2, 1.0, 0, compute, speculate);
      std::vector<EngineRun> runs;
      for (const int64_t g : {1, 2, 5}) runs.push_back(engine_losses(12, 2, 1.0, g, compute, speculate));
      // 0 device-side Blocks for 3 steps, then the memory range [3, 3] makes the solver move 3.
      runs.push_back(engine_losses(12, 2, 1.0, 0, compute, speculate, [](EngineOptions& o) {
        o.solve_split = true;
        o.min_gpu_blocks = o.max_gpu_blocks = 3;
        o.first_solve_step = 3;
      }));
      EXPECT_EQ(runs.back().gpu_blocks, 3);
      for (const auto& got : runs) {
        ASSERT_EQ(got.losses.size(), want.losses.size());
        for (size_t i = 0; i < want.losses.size(); ++i)
          EXPECT_EQ(got.losses[i], want.losses[i])
              << "step " << i + 1 << ", " << got.gpu_blocks << " device-side Blocks at the end";
      }
    }
  }
}

TEST(OffloadEngine, WritesAChromeTraceOfTheChosenSteps) {
  const std::string path = testing::TempDir() + "/offload_trace.json";
  std::remove(path.c_str());
  std::vector<std::string> lines;
  const auto got =
      engine_losses(6, 1, 1.0, 1, torch::kFloat32, EngineOptions::Speculate::kAlways, [&](EngineOptions& o) {
        o.trace_steps = {3, 4};
        o.trace_path = path;
        o.log = [&](const std::string& l) { lines.push_back(l); };
      });
  const auto j = nlohmann::json::parse(read_file(path, "trace"));
  std::map<int, int> spans;
  std::set<std::string> steps;
  double prev_compute_end = -1;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++spans[e["tid"].get<int>()];
    steps.insert(e["cat"].get<std::string>());
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    if (e["tid"] == 1) prev_compute_end = std::max(prev_compute_end, e["ts"].get<double>() + e["dur"].get<double>());
  }
  // Compute: 5 Blocks' forward and backward, the GPU update; D2H, H2D and CPU updates: 4 CPU Blocks.
  EXPECT_GE(spans[1], 2 * 9);
  EXPECT_EQ(spans[2], 2 * 4);
  EXPECT_EQ(spans[3], 2 * 4);
  EXPECT_GE(spans[4], 2 * 4);  // rollbacks add repeated updates
  EXPECT_EQ(steps, (std::set<std::string>{"step 3", "step 4"}));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("trace of 2 step(s)"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace tandem
