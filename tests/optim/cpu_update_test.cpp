// The CPU update kernels: every SIMD level against the scalar reference bit for bit, the reference
// against LibTorch's optimizers, bf16 rounding, non-finite detection, rollback, threading.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>

#include "../test_util.h"
#include "isa_kernels.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {
namespace {

using test::Buffers;
using test::first_difference;

// The shared buffers (tests/optim/isa_kernels.h) used from element 1, so no pointer is aligned to
// more than its element size; with or without the bf16 copy.
Buffers buffers(int64_t n, Dtype g, Dtype s, bool with_out, uint64_t seed) {
  Buffers b(n, 1, g, s, seed);
  b.with_out = with_out;
  return b;
}

std::vector<CpuIsa> fast_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (test::error_of([&] { set_cpu_isa(isa); }).empty()) out.push_back(isa);
  }
  set_cpu_isa(best_cpu_isa());
  return out;
}

// The shared hyper-parameters, seed 42, and SGD with Nesterov momentum.
UpdateHyper hyper_for(UpdateRule rule, Rounding rounding, int64_t step) {
  UpdateHyper h = test::hyper_for(rule, rounding, step, 42);
  h.nesterov = rule == UpdateRule::kSgd;
  return h;
}

TEST(CpuUpdate, EverySimdLevelMatchesTheScalarReferenceBitForBit) {
  const auto isas = fast_isas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has no SIMD level beyond scalar";
  CpuThreadPool pool(2);
  int cases = 0;
  for (int64_t n : {1, 7, 17, 1000003})
    for (UpdateRule rule : {UpdateRule::kAdamW, UpdateRule::kAdam, UpdateRule::kSgd, UpdateRule::kLion})
      for (Dtype gd : {Dtype::kF32, Dtype::kBF16})
        for (Dtype sd : {Dtype::kF32, Dtype::kBF16})
          for (Rounding rnd : {Rounding::kNearestEven, Rounding::kStochastic}) {
            if (sd == Dtype::kF32 && rnd == Rounding::kStochastic) continue;
            const bool with_out = (n + static_cast<int>(rule)) % 2 == 0 || n == 1000003;
            const Buffers start = buffers(n, gd, sd, with_out, 7 + n);
            Buffers ref = start.clone();
            for (int64_t step = 1; step <= 3; ++step)
              cpu_update({ref.span()}, hyper_for(rule, rnd, step), nullptr, &pool, CpuIsa::kScalar);
            for (CpuIsa isa : isas) {
              Buffers fast = start.clone();
              for (int64_t step = 1; step <= 3; ++step)
                cpu_update({fast.span()}, hyper_for(rule, rnd, step), nullptr, &pool, isa);
              SCOPED_TRACE(::testing::Message()
                           << to_string(isa) << " n=" << n << " rule=" << int(rule) << " grad=" << int(gd)
                           << " state=" << int(sd) << " rounding=" << int(rnd) << " out=" << with_out);
              EXPECT_EQ(first_difference(fast, ref), "");
              ++cases;
            }
            EXPECT_FALSE(torch::equal(ref.master, start.master)) << "the update changed nothing";
          }
  EXPECT_GT(cases, 0);
}

TEST(CpuUpdate, ResultsDoNotDependOnThreadsOrHowTheBufferIsCut) {
  const Buffers start = buffers(300001, Dtype::kBF16, Dtype::kBF16, true, 3);
  const UpdateHyper h = hyper_for(UpdateRule::kAdamW, Rounding::kStochastic, 2);
  CpuThreadPool one(1), four(4);
  Buffers a = start.clone(), b = start.clone();
  cpu_update({a.span()}, h, nullptr, &one);
  // Two calls on sub-ranges (cut at an odd place), four threads.
  cpu_update({b.span(0, 0, 123457), b.span(123457, 123457)}, h, nullptr, &four);
  EXPECT_EQ(first_difference(a, b), "");
}

// torch::optim::AdamW / Adam / SGD on the same data for 100 steps. The kernels perform LibTorch's
// operations in LibTorch's order except for the bias correction of the square root (a multiply by
// the reciprocal, fused with + eps), and LibTorch's vectorised CPU sqrt is not correctly rounded
// (about one element in six differs from the IEEE square root by an ulp), so the two drift apart by
// a few ulps of the update. Relative error is measured where it means something, on parameters that
// stay away from zero (|p| >= 0.5 at the start, and 100 steps of lr 1e-3 move them by at most 0.1);
// near zero the absolute error is bounded instead: 1e-5 lr, a few ulps of an update of size lr
// accumulated over 100 steps.
template <class TorchOpt, class Options>
void compare_with_torch(Options options, UpdateHyper h) {
  const int64_t n = 100003;
  torch::manual_seed(11);
  auto start = torch::randn({n});
  start = torch::where(torch::arange(n) % 2 == 0, start.sign() * (0.5 + start.abs()), start);  // even: away from 0
  auto p_ref = start.clone().requires_grad_(true);
  TorchOpt ref({p_ref}, options);
  torch::Tensor master = start.clone(), m = torch::zeros({n}), v = torch::zeros({n});
  UpdateSpan s;
  s.master = master.data_ptr<float>(), s.m = m.data_ptr(), s.v = v.data_ptr(), s.n = n;
  for (int64_t step = 1; step <= 100; ++step) {
    auto g = torch::randn({n}) * (step % 7 == 0 ? 10.0 : 0.1);
    p_ref.mutable_grad() = g.clone();
    ref.step();
    s.grad = g.data_ptr();
    h.step = step;
    ASSERT_TRUE(cpu_update({s}, h, nullptr, nullptr, CpuIsa::kScalar).ok());
  }
  const auto away = torch::arange(n) % 2 == 0;
  EXPECT_TRUE(test::AllClose(master.index({away}), p_ref.detach().index({away}), 1e-6, 0.0));
  EXPECT_TRUE(test::AllClose(master, p_ref.detach(), 1e-6, 1e-5 * h.lr));
}

TEST(CpuUpdate, AdamWMatchesTorchOptimAdamWFor100Steps) {
  UpdateHyper h;
  h.rule = UpdateRule::kAdamW, h.lr = 1e-3, h.beta1 = 0.9, h.beta2 = 0.95, h.eps = 1e-8, h.weight_decay = 0.1;
  compare_with_torch<torch::optim::AdamW>(
      torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1), h);
}

TEST(CpuUpdate, AdamMatchesTorchOptimAdamFor100Steps) {
  UpdateHyper h;
  h.rule = UpdateRule::kAdam, h.lr = 1e-3, h.beta1 = 0.8, h.beta2 = 0.99, h.eps = 1e-6, h.weight_decay = 0.01;
  compare_with_torch<torch::optim::Adam>(
      torch::optim::AdamOptions(1e-3).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.01), h);
}

TEST(CpuUpdate, SgdMatchesTorchOptimSgdFor100Steps) {
  UpdateHyper h;
  h.rule = UpdateRule::kSgd, h.lr = 1e-3, h.beta1 = 0.9, h.weight_decay = 1e-4, h.nesterov = true;
  compare_with_torch<torch::optim::SGD>(torch::optim::SGDOptions(1e-3).momentum(0.9).weight_decay(1e-4).nesterov(true),
                                        h);
}

TEST(CpuUpdate, LionMatchesADoublePrecisionReference) {
  const int64_t n = 4099;
  torch::manual_seed(2);
  torch::Tensor p = torch::randn({n}), m = torch::zeros({n});
  torch::Tensor pd = p.to(torch::kFloat64), md = torch::zeros({n}, torch::kFloat64);
  UpdateHyper h;
  h.rule = UpdateRule::kLion, h.lr = 1e-4, h.beta1 = 0.9, h.beta2 = 0.99, h.weight_decay = 0.1;
  UpdateSpan s;
  s.master = p.data_ptr<float>(), s.m = m.data_ptr(), s.n = n;
  for (int64_t step = 1; step <= 20; ++step) {
    // Gradients well away from zero so the sign of the interpolation is the same in both precisions.
    auto g = torch::randn({n}).sign() * (0.5 + torch::rand({n}));
    auto gd = g.to(torch::kFloat64);
    pd = pd * (1 - h.lr * h.weight_decay) - h.lr * (h.beta1 * md + (1 - h.beta1) * gd).sign();
    md = h.beta2 * md + (1 - h.beta2) * gd;
    s.grad = g.data_ptr();
    h.step = step;
    ASSERT_TRUE(cpu_update({s}, h).ok());
  }
  EXPECT_TRUE(test::AllClose(p, pd, 1e-5, 1e-7));  // fp32 rounding of 20 decays
  EXPECT_TRUE(test::AllClose(m, md, 1e-5, 1e-7));
}

TEST(CpuUpdate, Bf16CopyEqualsRoundingOfTheFp32Result) {
  for (CpuIsa isa : {CpuIsa::kScalar, best_cpu_isa()}) {
    Buffers b = buffers(1000003, Dtype::kBF16, Dtype::kF32, true, 5);
    cpu_update({b.span()}, hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 1), nullptr, nullptr, isa);
    const auto expected = b.master.slice(0, 1).to(torch::kBFloat16);  // LibTorch: round to nearest even
    EXPECT_TRUE(torch::equal(b.out.slice(0, 1).view(torch::kInt16), expected.view(torch::kInt16))) << to_string(isa);
  }
}

TEST(CpuUpdate, Bf16ConversionOfSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to the even one; subnormals flush to zero.
  const std::vector<float> in = {0.0f,    -0.0f,  1.0f + 1.0f / 256, 1.0f + 3.0f / 256, inf, -inf, nan, 1e-39f,
                                 -1e-39f, 3.4e38f};
  const std::vector<uint16_t> want = {0x0000, 0x8000, 0x3F80, 0x3F82, 0x7F80, 0xFF80, 0x7FC0, 0x0000, 0x8000, 0x7F80};
  for (CpuIsa isa : {CpuIsa::kScalar, best_cpu_isa()}) {
    set_cpu_isa(isa);
    std::vector<float> src(in);
    for (int rep = 0; rep < 3; ++rep) src.insert(src.end(), in.begin(), in.end());  // past one vector width
    std::vector<uint16_t> dst(src.size());
    cpu_to_bf16(src.data(), dst.data(), static_cast<int64_t>(src.size()));
    for (size_t i = 0; i < src.size(); ++i)
      EXPECT_EQ(dst[i], want[i % want.size()]) << to_string(isa) << " element " << i << " = " << src[i];
  }
  set_cpu_isa(best_cpu_isa());
}

TEST(CpuUpdate, StochasticRoundingIsUnbiased) {
  // SGD with momentum stores its first buffer as the gradient itself: the stored bf16 values are
  // the stochastic rounding of a constant that lies 3/8 of the way from one bf16 value to the next.
  const int64_t n = 1 << 20;
  const float lo = 1.0f, hi = 1.0f + 1.0f / 128, x = lo + 0.375f * (hi - lo);
  torch::Tensor p = torch::zeros({n}), g = torch::full({n}, x), m = torch::zeros({n}, torch::kBFloat16);
  UpdateSpan s;
  s.master = p.data_ptr<float>(), s.grad = g.data_ptr(), s.m = m.data_ptr(), s.n = n, s.state_dtype = Dtype::kBF16;
  UpdateHyper h;
  h.rule = UpdateRule::kSgd, h.beta1 = 0.9, h.step = 1, h.rounding = Rounding::kStochastic, h.seed = 9;
  ASSERT_TRUE(cpu_update({s}, h).ok());
  const auto mf = m.to(torch::kFloat32);
  EXPECT_TRUE(torch::logical_or(mf == lo, mf == hi).all().item<bool>());
  const double up = (mf == hi).to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(up, 0.375, 0.005);  // binomial sd at n = 2^20 is 0.0005
  // Nearest even puts every element on the lower value.
  h.rounding = Rounding::kNearestEven;
  ASSERT_TRUE(cpu_update({s}, h).ok());
  EXPECT_TRUE((m.to(torch::kFloat32) == lo).all().item<bool>());
}

TEST(CpuUpdate, NonFiniteGradientsAreReportedAndTheirTilesLeftUntouched) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, best_cpu_isa()})
    for (Dtype gd : {Dtype::kF32, Dtype::kBF16}) {
      if (!test::error_of([&] { set_cpu_isa(isa); }).empty()) continue;
      set_cpu_isa(best_cpu_isa());
      Buffers b = buffers(10000, gd, Dtype::kF32, true, 8);
      auto g = b.grad.slice(0, 1);
      g[5000] = std::numeric_limits<float>::quiet_NaN();
      g[9999] = -std::numeric_limits<float>::infinity();
      const Buffers before = b.clone();
      const UpdateReport r =
          cpu_update({b.span()}, hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 1), nullptr, nullptr, isa);
      SCOPED_TRACE(::testing::Message() << to_string(isa) << " grad dtype " << int(gd));
      EXPECT_FALSE(r.ok());
      EXPECT_EQ(r.nonfinite, 2);
      EXPECT_EQ(r.first_nonfinite, 5000);
      EXPECT_EQ(r.skipped_tiles, 2);  // tiles [4096, 6144) and [8192, 10000)
      auto p = b.master.slice(0, 1), p0 = before.master.slice(0, 1);
      EXPECT_TRUE(torch::equal(p.slice(0, 4096, 6144), p0.slice(0, 4096, 6144)));
      EXPECT_TRUE(torch::equal(p.slice(0, 8192), p0.slice(0, 8192)));
      EXPECT_TRUE(torch::isfinite(b.m).all().item<bool>() && torch::isfinite(b.v).all().item<bool>());
      EXPECT_FALSE(torch::equal(p.slice(0, 0, 4096), p0.slice(0, 0, 4096)));
    }
}

TEST(CpuUpdate, AScaleThatOverflowsAFiniteGradientIsCaught) {
  for (CpuIsa isa : {CpuIsa::kScalar, best_cpu_isa()}) {
    Buffers b = buffers(5000, Dtype::kF32, Dtype::kF32, false, 9);
    b.grad.slice(0, 1)[4321] = 3e38f;
    UpdateHyper h = hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 1);
    h.grad_scale = 4.0;  // 1.2e39 overflows fp32
    const UpdateReport r = cpu_update({b.span()}, h, nullptr, nullptr, isa);
    EXPECT_EQ(r.nonfinite, 1) << to_string(isa);
    EXPECT_EQ(r.first_nonfinite, 4321) << to_string(isa);
    // Unchecked, the caller vouches for the gradients and nothing is scanned.
    h.check_finite = false;
    EXPECT_TRUE(cpu_update({b.span()}, h, nullptr, nullptr, isa).ok());
    EXPECT_FALSE(std::isfinite(b.master[4322].item<float>()));
  }
}

TEST(CpuUpdate, RollbackRestoresTheStateBitForBit) {
  for (Dtype sd : {Dtype::kF32, Dtype::kBF16}) {
    Buffers b = buffers(200003, Dtype::kBF16, sd, true, 4);
    cpu_update({b.span()}, hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 1));  // a realistic state
    // bf16 copy consistent with the master before the speculative step
    cpu_to_bf16(b.master.data_ptr<float>(), reinterpret_cast<uint16_t*>(b.out.data_ptr()), b.n + 1);
    const Buffers before = b.clone();
    torch::Tensor um = torch::empty_like(b.master), mm = torch::empty_like(b.m), vv = torch::empty_like(b.v);
    std::vector<UndoLog> undo = {{um.data_ptr<float>() + 1, static_cast<char*>(mm.data_ptr()) + mm.element_size(),
                                  static_cast<char*>(vv.data_ptr()) + vv.element_size()}};
    b.grad.slice(0, 1)[150000] = std::numeric_limits<float>::infinity();  // inside a chunk (look-ahead scan)
    b.grad.slice(0, 1)[65537] = std::numeric_limits<float>::quiet_NaN();  // a chunk's first tile
    const UpdateReport r = cpu_update({b.span()}, hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 2), &undo);
    EXPECT_EQ(r.nonfinite, 2);
    EXPECT_EQ(r.first_nonfinite, 65537);
    EXPECT_NE(first_difference(b, before), "");  // the other tiles were updated
    cpu_rollback({b.span()}, undo);
    EXPECT_EQ(first_difference(b, before), "") << "state dtype " << int(sd);
  }
}

// Note [Parameter groups]: a span of a group updates exactly as a call with the group's lr, betas,
// eps and weight decay and its own step count would; the span beside it keeps the call's.
TEST(CpuUpdate, AGroupsSpanUpdatesAsACallWithTheGroupsHyperParameters) {
  const Buffers base = buffers(1000, Dtype::kBF16, Dtype::kF32, true, 7);
  UpdateHyper call = hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 5);
  GroupHyper g{3e-3, 0.8, 0.99, 1e-6, 0.3, 3};  // its step: 5 - 3 = 2
  UpdateHyper as_group = call;
  as_group.lr = g.lr, as_group.beta1 = g.beta1, as_group.beta2 = g.beta2, as_group.eps = g.eps;
  as_group.weight_decay = g.weight_decay, as_group.step = 2;

  Buffers grouped = base.clone(), alone = base.clone();
  UpdateSpan first = grouped.span(0, 0, 400), second = grouped.span(400, 400);
  first.group = &g;
  cpu_update({first, second}, call);
  cpu_update({alone.span(0, 0, 400)}, as_group);
  cpu_update({alone.span(400, 400)}, call);
  EXPECT_EQ(first_difference(grouped, alone), "");
  // And a different group gives different values (the group is read, not ignored).
  Buffers other = base.clone();
  cpu_update({other.span()}, call);
  EXPECT_NE(first_difference(grouped, other), "");
}

TEST(CpuUpdate, ByteModel) {
  EXPECT_EQ(bytes_per_element(UpdateRule::kAdamW, Dtype::kF32, Dtype::kF32, false), 28);
  EXPECT_EQ(bytes_per_element(UpdateRule::kAdamW, Dtype::kBF16, Dtype::kF32, true), 28);
  EXPECT_EQ(bytes_per_element(UpdateRule::kAdamW, Dtype::kBF16, Dtype::kBF16, false), 18);
  EXPECT_EQ(bytes_per_element(UpdateRule::kLion, Dtype::kF32, Dtype::kF32, false), 20);
}

TEST(CpuUpdate, UnsupportedLevelsAndNamesAreRefusedClearly) {
  EXPECT_NE(test::error_of([] { parse_cpu_isa("sse9"); }).find("use auto, scalar, avx2"), std::string::npos);
  EXPECT_EQ(parse_cpu_isa("auto"), best_cpu_isa());
  EXPECT_EQ(parse_cpu_isa("scalar"), CpuIsa::kScalar);
}

}  // namespace
}  // namespace tandem
