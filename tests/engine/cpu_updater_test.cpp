// The CPU updater on the CPU device: a job's update against AdamW's first step computed by hand,
// the new weights sent up (or held back for a delayed update), a speculative update rolled back
// bit for bit, the host ring against per-Block buffers, a failure on the updater thread rethrown,
// and the spans kept for the trace.

#include "tandem/engine/cpu_updater.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "../test_util.h"
#include "engine_fixtures.h"
#include "tandem/core/error.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

constexpr double kLr = 1e-2, kB1 = 0.9, kB2 = 0.95, kEps = 1e-8, kWd = 0.1;

ModelSpec small_spec() { return test::small_engine_spec(3); }

// A model, its store, the stamps and an updater over them (the CPU as the device).
struct Rig {
  std::shared_ptr<Model> model;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<StepStamps> stamps;
  std::unique_ptr<CpuUpdater> updater;

  explicit Rig(ParamStoreOptions so = {}, bool delayed = false) {
    torch::manual_seed(7);
    model = build_model(small_spec(), false);
    store = std::make_unique<ParamStore>(*model, so, 0);
    stamps = std::make_unique<StepStamps>(store->blocks().size(), false);
    CpuUpdaterOptions o;
    o.hyper.rule = UpdateRule::kAdamW;
    o.hyper.beta1 = kB1;
    o.hyper.beta2 = kB2;
    o.hyper.eps = kEps;
    o.hyper.weight_decay = kWd;
    o.delayed = delayed;
    updater = std::make_unique<CpuUpdater>(*store, o, nullptr, *stamps);
  }
  BlockStore& block(size_t i) { return store->blocks()[i]; }
};

CpuUpdateJob job(size_t block, double grad_scale = 1.0, bool undo = false, bool upload = true) {
  CpuUpdateJob j;
  j.block = block;
  j.grad_scale = grad_scale;
  j.lr = kLr;
  j.step = 1;
  j.undo = undo;
  j.upload = upload;
  return j;
}

// A deterministic gradient for Block b's slice, in `dtype`.
torch::Tensor gradient(const BlockStore& b, uint64_t seed, torch::ScalarType dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  return (torch::randn({b.shard_numel}) * 1e-2).to(dtype);
}

// AdamW's first update by hand, in fp64: m = (1-b1) g, v = (1-b2) g^2, bias-corrected to g and g^2.
struct Reference {
  torch::Tensor master, m, v;
};
Reference adamw_first_step(const BlockStore& b, const torch::Tensor& w0, const torch::Tensor& grad, double scale) {
  auto wd_scale = torch::zeros({b.shard_numel}, torch::kFloat64);
  for (const auto& f : b.shard_params) wd_scale.narrow(0, f.offset, f.numel).fill_(f.weight_decay_scale);
  const auto g = grad.to(torch::kFloat64) * scale;
  const auto m = (1 - kB1) * g, v = (1 - kB2) * g * g;
  const auto step = (m / (1 - kB1)) / ((v / (1 - kB2)).sqrt() + kEps);
  return {w0.to(torch::kFloat64) * (1 - kLr * kWd * wd_scale) - kLr * step, m, v};
}

// fp32 arithmetic against the fp64 reference: a few roundings of each operand. The master's
// rounding errors are relative to the weight and the step, not to the (possibly cancelled) result.
constexpr double kFp32Eps = std::numeric_limits<float>::epsilon();
void expect_close(const torch::Tensor& got, const torch::Tensor& want, double atol, const char* what) {
  EXPECT_TRUE(test::AllClose(got, want, 8 * kFp32Eps, atol)) << what;
}

TEST(CpuUpdater, UpdatesABlockFromItsLandingBufferAndSendsItUp) {
  Rig rig;
  auto& b = rig.block(2);
  const auto w0 = b.master.clone(), other = rig.block(1).master.clone();
  const auto g = gradient(b, 1);
  b.landing.copy_(g);
  // The gradient's copy down took 0.25 s by the stamps: counted as transfer time once the update runs.
  auto& st = *rig.stamps;
  st.d2h0[2].host = 1.0;
  st.d2h1[2].host = 1.25;
  st.d2h0[2].set = st.d2h1[2].set = true;
  rig.updater->enqueue({job(2, 0.5)});
  rig.updater->wait_updated(2);
  const auto want = adamw_first_step(b, w0, g, 0.5);
  expect_close(b.master, want.master, 4 * kFp32Eps * (w0.abs().max().item<double>() + kLr), "master");
  expect_close(b.m, want.m, 0.0, "m");
  expect_close(b.v, want.v, 0.0, "v");
  EXPECT_TRUE(torch::equal(b.staging, b.master));  // fp32 weights: the master copied
  EXPECT_TRUE(torch::equal(b.working, b.master));  // and sent up
  EXPECT_TRUE(st.h2d0[2].set && st.h2d1[2].set);
  EXPECT_TRUE(torch::equal(rig.block(1).master, other)) << "another Block changed";
  const auto c = rig.updater->counters();
  EXPECT_EQ(c.cpu_updated_params, b.shard_numel);
  EXPECT_GT(c.cpu_update_s, 0.0);
  EXPECT_DOUBLE_EQ(c.transfer_s, 0.25);
}

TEST(CpuUpdater, ASpeculativeUpdateRollsBackBitForBit) {
  ParamStoreOptions so;
  so.compute_dtype = torch::kBFloat16;
  so.host_state_dtype = torch::kBFloat16;
  Rig rig(so);
  auto& b = rig.block(3);
  // A first update so that the states are not zero.
  b.landing.copy_(gradient(b, 2, torch::kBFloat16));
  rig.updater->enqueue({job(3)});
  rig.updater->wait_idle();
  const auto master = b.master.clone(), m = b.m.clone(), v = b.v.clone(), staging = b.staging.clone();
  b.landing.copy_(gradient(b, 3, torch::kBFloat16));
  auto second = job(3, 1.0, /*undo=*/true);
  second.step = 2;
  rig.updater->enqueue({second});
  rig.updater->wait_idle();
  EXPECT_FALSE(torch::equal(b.master, master));
  // bf16 weights are written by the kernel, rounded to nearest as a cast rounds them.
  EXPECT_TRUE(torch::equal(b.staging, b.master.to(torch::kBFloat16)));
  rig.updater->roll_back(3);
  EXPECT_TRUE(torch::equal(b.master, master));
  EXPECT_TRUE(torch::equal(b.m, m));
  EXPECT_TRUE(torch::equal(b.v, v));
  EXPECT_TRUE(torch::equal(b.staging, staging));
}

TEST(CpuUpdater, ADelayedUpdateWaitsOnTheHostUntilItIsUploaded) {
  Rig rig({}, /*delayed=*/true);
  auto& b = rig.block(1);
  const auto w0 = b.working.clone();
  b.landing.copy_(gradient(b, 4));
  EXPECT_FALSE(rig.updater->pending_upload(1));
  rig.updater->enqueue({job(1, 1.0, false, /*upload=*/false)});
  EXPECT_TRUE(rig.updater->pending_upload(1));
  rig.updater->wait_updated(1);
  EXPECT_FALSE(torch::equal(b.master, w0));
  EXPECT_TRUE(torch::equal(b.working, w0)) << "the device copy changed before the next backward";
  rig.updater->upload_pending(1);
  EXPECT_FALSE(rig.updater->pending_upload(1));
  EXPECT_TRUE(torch::equal(b.working, b.master));
  // From a dispatch: waits for the update queued, then uploads it.
  auto next = job(1, 1.0, false, false);
  next.step = 2;
  rig.updater->enqueue({next});
  rig.updater->upload_after_backward(1);
  EXPECT_FALSE(rig.updater->pending_upload(1));
  EXPECT_TRUE(torch::equal(b.working, b.master));
}

TEST(CpuUpdater, AHostRingGivesTheBitsOfPerBlockBuffersAndZeroesTheGradients) {
  ParamStoreOptions so;
  so.undo = false;
  for (const int64_t slots : {1, 2, 8}) {
    SCOPED_TRACE(std::to_string(slots) + " slots");
    ParamStoreOptions ring = so;
    ring.ring_slots = slots;
    Rig a(ring), want(so);
    std::vector<CpuUpdateJob> jobs;
    for (size_t i = 0; i < a.store->blocks().size(); ++i) {
      const auto g = gradient(a.block(i), 10 + i);
      a.block(i).grad.copy_(g);        // the ring copies it down itself
      want.block(i).landing.copy_(g);  // per-Block buffers: the engine did
      jobs.push_back(job(i, 0.75));
    }
    a.updater->enqueue(jobs);
    want.updater->enqueue(jobs);
    a.updater->wait_idle();
    want.updater->wait_idle();
    for (size_t i = 0; i < a.store->blocks().size(); ++i) {
      auto& x = a.block(i);
      auto& y = want.block(i);
      EXPECT_TRUE(torch::equal(x.master, y.master)) << x.name;
      EXPECT_TRUE(torch::equal(x.m, y.m)) << x.name;
      EXPECT_TRUE(torch::equal(x.v, y.v)) << x.name;
      EXPECT_TRUE(torch::equal(x.working, y.working)) << x.name;
      EXPECT_EQ(x.grad.count_nonzero().item<int64_t>(), 0) << x.name << ": the device gradient is not zeroed";
    }
  }
}

TEST(CpuUpdater, AFailureOnTheUpdaterThreadIsRethrownByTheWaits) {
  ParamStoreOptions so;
  so.undo = false;  // no undo buffers: a speculative job cannot run
  Rig rig(so);
  rig.updater->enqueue({job(2, 1.0, /*undo=*/true)});
  try {
    rig.updater->wait_updated(2);
    ADD_FAILURE() << "no exception";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("has no undo buffers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rig.updater->wait_idle(), InternalError);
}

TEST(CpuUpdater, KeepsOneSpanPerUpdateForTheTraceWhileAsked) {
  Rig rig;
  rig.updater->enqueue({job(4)});  // not traced
  rig.updater->wait_idle();
  EXPECT_TRUE(rig.updater->trace(true).empty());
  const double t0 = rig.stamps->host_now();
  rig.updater->enqueue({job(1), job(3, 1.0, /*undo=*/true)});
  rig.updater->wait_idle();
  const double t1 = rig.stamps->host_now();
  const auto spans = rig.updater->trace(false);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].block, 1u);  // in the order queued
  EXPECT_FALSE(spans[0].speculative);
  EXPECT_EQ(spans[1].block, 3u);
  EXPECT_TRUE(spans[1].speculative);
  for (const auto& s : spans) {
    EXPECT_LE(t0, s.t0);
    EXPECT_LE(s.t0, s.t1);
    EXPECT_LE(s.t1, t1);
  }
  EXPECT_LE(spans[0].t1, spans[1].t0);
  rig.updater->enqueue({job(2)});
  rig.updater->wait_idle();
  EXPECT_TRUE(rig.updater->trace(false).empty());
}

}  // namespace
}  // namespace tandem
