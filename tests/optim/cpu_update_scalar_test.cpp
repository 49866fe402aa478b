// The scalar reference of the CPU update kernels: every rule and option against a double-precision
// reference, bf16 states as rounded fp32 states, grad and decay scales as exact rewrites, stochastic
// rounding by (seed, index), and non-finite tiles under an index base.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "../test_util.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {
namespace {

constexpr double kF32Eps = std::numeric_limits<float>::epsilon();

torch::ScalarType torch_type(Dtype d) { return d == Dtype::kF32 ? torch::kFloat32 : torch::kBFloat16; }

// Gradients of magnitude 0.5 .. 1.5 and random sign (see LionSafe below).
torch::Tensor gradient(int64_t n) { return torch::randn({n}).sign() * (0.5 + torch::rand({n})); }

// One span's buffers, contiguous, states starting at zero.
struct Buffers {
  torch::Tensor p, g, m, v;
  Dtype gd = Dtype::kF32, sd = Dtype::kF32;

  Buffers(int64_t n, Dtype grad, Dtype state, uint64_t seed) : gd(grad), sd(state) {
    torch::manual_seed(seed);
    p = torch::randn({n});
    g = gradient(n).to(torch_type(grad));
    m = torch::zeros({n}, torch_type(state));
    v = torch::zeros({n}, torch_type(state));
  }
  Buffers clone() const {
    Buffers b = *this;
    b.p = p.clone(), b.g = g.clone(), b.m = m.clone(), b.v = v.clone();
    return b;
  }
  UpdateSpan span(int64_t begin = 0, int64_t index_base = 0) const {
    UpdateSpan s;
    s.n = p.numel() - begin;
    s.master = p.data_ptr<float>() + begin;
    s.grad = static_cast<char*>(g.data_ptr()) + begin * g.element_size();
    s.m = static_cast<char*>(m.data_ptr()) + begin * m.element_size();
    s.v = static_cast<char*>(v.data_ptr()) + begin * v.element_size();
    s.grad_dtype = gd;
    s.state_dtype = sd;
    s.index_base = index_base;
    return s;
  }
};

UpdateReport scalar_update(const std::vector<UpdateSpan>& spans, const UpdateHyper& h) {
  return cpu_update(spans, h, nullptr, nullptr, CpuIsa::kScalar);
}

// Bitwise equality of two tensors of one dtype.
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

struct RuleCase {
  const char* what;
  UpdateRule rule;
  double beta1, beta2, dampening;
  bool nesterov;
};

const RuleCase kRules[] = {
    {"adamw", UpdateRule::kAdamW, 0.9, 0.95, 0, false},
    {"adam", UpdateRule::kAdam, 0.8, 0.99, 0, false},
    {"sgd", UpdateRule::kSgd, 0.0, 0, 0, false},
    {"sgd momentum, dampening", UpdateRule::kSgd, 0.7, 0, 0.3, false},
    {"sgd nesterov", UpdateRule::kSgd, 0.7, 0, 0, true},
    // Lion: with |g| in 0.5 .. 1.5 and beta2 = 0.99, |0.9 m| stays below |0.1 g| for three steps,
    // so the sign it takes is the gradient's in fp32 and in double alike.
    {"lion", UpdateRule::kLion, 0.9, 0.99, 0, false},
};

UpdateHyper hyper_of(const RuleCase& c, int64_t step) {
  UpdateHyper h;
  h.rule = c.rule, h.beta1 = c.beta1, h.beta2 = c.beta2, h.dampening = c.dampening, h.nesterov = c.nesterov;
  h.lr = 1e-2, h.eps = 1e-8, h.weight_decay = 0.1, h.grad_scale = 0.75, h.step = step;
  return h;
}

// One update in double: the rule as torch.optim (and the Lion paper) define it.
void reference_update(const UpdateHyper& h, double wd, torch::Tensor& p, torch::Tensor& m, torch::Tensor& v,
                      const torch::Tensor& grad) {
  auto g = grad.to(torch::kFloat64) * h.grad_scale;
  const double lr = h.lr;
  const auto t = static_cast<double>(h.step);
  switch (h.rule) {
    case UpdateRule::kAdamW:
    case UpdateRule::kAdam:
      if (h.rule == UpdateRule::kAdam)
        g = g + wd * p;
      else
        p = p * (1 - lr * wd);
      m = h.beta1 * m + (1 - h.beta1) * g;
      v = h.beta2 * v + (1 - h.beta2) * g * g;
      p = p - lr / (1 - std::pow(h.beta1, t)) * m / (torch::sqrt(v / (1 - std::pow(h.beta2, t))) + h.eps);
      break;
    case UpdateRule::kSgd:
      g = g + wd * p;
      if (h.beta1 != 0) {
        m = h.step == 1 ? g : h.beta1 * m + (1 - h.dampening) * g;
        g = h.nesterov ? g + h.beta1 * m : m;
      }
      p = p - lr * g;
      break;
    case UpdateRule::kLion:
      p = p * (1 - lr * wd) - lr * (h.beta1 * m + (1 - h.beta1) * g).sign();
      m = h.beta2 * m + (1 - h.beta2) * g;
      break;
  }
}

TEST(CpuUpdateScalar, EveryRuleMatchesADoublePrecisionReference) {
  for (const int64_t n : {1, 7, 17, 1000003})
    for (const RuleCase& c : kRules)
      for (const Dtype gd : {Dtype::kF32, Dtype::kBF16}) {
        SCOPED_TRACE(::testing::Message() << c.what << " n=" << n << " grad " << (gd == Dtype::kF32 ? "f32" : "bf16"));
        Buffers b(n, gd, Dtype::kF32, 100 + n);
        auto p = b.p.to(torch::kFloat64), m = torch::zeros_like(p), v = torch::zeros_like(p);
        const float decay_scale = 0.5f;  // the span decays at half the call's rate
        for (int64_t step = 1; step <= 3; ++step) {
          b.g.copy_(gradient(n).to(torch_type(gd)));
          UpdateSpan s = b.span();
          s.weight_decay_scale = decay_scale;
          const UpdateHyper h = hyper_of(c, step);
          ASSERT_TRUE(scalar_update({s}, h).ok());
          reference_update(h, h.weight_decay * decay_scale, p, m, v, b.g);
        }
        // fp32 rounding of a few operations per step over three steps; updates up to 10 lr.
        const double rtol = 3 * 8 * kF32Eps, atol = rtol * 10 * 1e-2;
        EXPECT_TRUE(test::AllClose(b.p, p, rtol, atol)) << "master";
        const bool has_m = c.rule != UpdateRule::kSgd || c.beta1 != 0;
        if (has_m) {
          EXPECT_TRUE(test::AllClose(b.m, m, rtol, rtol)) << "first state";
        }
        if (c.rule == UpdateRule::kAdamW || c.rule == UpdateRule::kAdam) {
          EXPECT_TRUE(test::AllClose(b.v, v, rtol, rtol)) << "second state";
        }
      }
}

TEST(CpuUpdateScalar, SgdWithoutMomentumNeedsNoStateBuffer) {
  Buffers b(17, Dtype::kF32, Dtype::kF32, 3);
  const auto p0 = b.p.to(torch::kFloat64);
  UpdateSpan s = b.span();
  s.m = nullptr, s.v = nullptr;
  UpdateHyper h = hyper_of(kRules[2], 1);
  h.grad_scale = 1;
  ASSERT_TRUE(scalar_update({s}, h).ok());
  EXPECT_TRUE(test::AllClose(b.p, p0 - h.lr * (b.g.to(torch::kFloat64) + h.weight_decay * p0), 4 * kF32Eps,
                             4 * kF32Eps * h.lr));
}

// A bf16 state is the fp32 state rounded to nearest even, and reads back as its widened value: two
// steps with bf16 states equal two steps with fp32 states restarted from the widened bf16 values.
TEST(CpuUpdateScalar, Bf16StatesHoldTheRoundedFp32StateAndReadBackWidened) {
  for (const RuleCase& c : kRules) {
    if (c.rule == UpdateRule::kSgd && c.beta1 == 0) continue;  // no state
    SCOPED_TRACE(c.what);
    const Buffers start(4099, Dtype::kF32, Dtype::kF32, 7);
    Buffers wide = start.clone(), low = start.clone();
    low.sd = Dtype::kBF16;
    low.m = torch::zeros({4099}, torch::kBFloat16), low.v = torch::zeros({4099}, torch::kBFloat16);
    const bool adam = c.rule == UpdateRule::kAdamW || c.rule == UpdateRule::kAdam;
    for (int64_t step = 1; step <= 2; ++step) {
      torch::manual_seed(70 + step);
      const auto g = gradient(4099);
      wide.g.copy_(g), low.g.copy_(g);
      if (step == 2) {  // the fp32 run restarts from what the bf16 states read back as
        wide.m.copy_(low.m.to(torch::kFloat32));
        wide.v.copy_(low.v.to(torch::kFloat32));
      }
      UpdateHyper h = hyper_of(c, step);
      ASSERT_TRUE(scalar_update({wide.span()}, h).ok());
      ASSERT_TRUE(scalar_update({low.span()}, h).ok());
      EXPECT_TRUE(same_bits(low.p, wide.p)) << "step " << step << ": the master moved differently";
      EXPECT_TRUE(same_bits(low.m, wide.m.to(torch::kBFloat16))) << "step " << step << ": first state";
      if (adam) {
        EXPECT_TRUE(same_bits(low.v, wide.v.to(torch::kBFloat16))) << "step " << step << ": second state";
      }
    }
  }
}

// grad_scale multiplies each gradient first, in fp32: the same as handing in g * scale, bit for bit,
// for a bf16 gradient too (its fp32 value times the scale).
TEST(CpuUpdateScalar, TheGradientScaleIsAnFp32MultiplyOfEachGradient) {
  for (const RuleCase& c : kRules)
    for (const Dtype gd : {Dtype::kF32, Dtype::kBF16})
      for (const double scale : {0.3, 1.7}) {  // 1.7: a scale that could overflow takes the exact count
        SCOPED_TRACE(::testing::Message() << c.what << " scale " << scale << " bf16 grad " << (gd == Dtype::kBF16));
        const Buffers start(2053, gd, Dtype::kF32, 9);
        Buffers scaled = start.clone();
        Buffers pre = start.clone();
        pre.gd = Dtype::kF32;
        pre.g = start.g.to(torch::kFloat32).clone();  // a copy even when it is fp32 already
        const float fs = static_cast<float>(scale);
        float* pg = pre.g.data_ptr<float>();
        for (int64_t i = 0; i < pre.g.numel(); ++i) pg[i] = pg[i] * fs;
        for (int64_t step = 1; step <= 2; ++step) {
          UpdateHyper h = hyper_of(c, step);
          h.grad_scale = scale;
          ASSERT_TRUE(scalar_update({scaled.span()}, h).ok());
          h.grad_scale = 1.0;
          ASSERT_TRUE(scalar_update({pre.span()}, h).ok());
        }
        EXPECT_TRUE(same_bits(scaled.p, pre.p));
        EXPECT_TRUE(same_bits(scaled.m, pre.m));
        EXPECT_TRUE(same_bits(scaled.v, pre.v));
      }
}

TEST(CpuUpdateScalar, TheSpansDecayScaleScalesTheWeightDecay) {
  for (const RuleCase& c : kRules) {
    SCOPED_TRACE(c.what);
    const Buffers start(517, Dtype::kF32, Dtype::kF32, 11);
    Buffers off = start.clone(), none = start.clone(), half = start.clone(), halved = start.clone(),
            full = start.clone();
    for (int64_t step = 1; step <= 2; ++step) {
      UpdateHyper h = hyper_of(c, step);
      h.weight_decay = 0.2;
      UpdateSpan s = off.span();
      s.weight_decay_scale = 0.0f;  // a norm's scale or a bias
      ASSERT_TRUE(scalar_update({s}, h).ok());
      s = half.span();
      s.weight_decay_scale = 0.5f;
      ASSERT_TRUE(scalar_update({s}, h).ok());
      ASSERT_TRUE(scalar_update({full.span()}, h).ok());
      h.weight_decay = 0.0;
      ASSERT_TRUE(scalar_update({none.span()}, h).ok());
      h.weight_decay = 0.1;
      ASSERT_TRUE(scalar_update({halved.span()}, h).ok());
    }
    EXPECT_TRUE(same_bits(off.p, none.p)) << "a decay scale of 0 still decayed";
    EXPECT_TRUE(same_bits(half.p, halved.p)) << "a decay scale of 0.5 is not half the decay";
    EXPECT_FALSE(same_bits(full.p, half.p)) << "the decay scale was ignored";
  }
}

// Stochastic rounding stores one of the two bf16 neighbours of the fp32 value, chosen by a hash of
// (seed, step, element index): not by the call's cut or the buffer's address.
TEST(CpuUpdateScalar, StochasticRoundingPicksANeighbourByIndexAndSeed) {
  const int64_t n = 10007;
  const Buffers start(n, Dtype::kF32, Dtype::kF32, 13);
  Buffers wide = start.clone();
  UpdateHyper h = hyper_of(kRules[0], 1);
  ASSERT_TRUE(scalar_update({wide.span()}, h).ok());

  h.rounding = Rounding::kStochastic;
  h.seed = 5;
  const auto bf16_run = [&](uint64_t seed, int64_t cut) {
    Buffers b = start.clone();
    b.sd = Dtype::kBF16;
    b.m = torch::zeros({n}, torch::kBFloat16), b.v = torch::zeros({n}, torch::kBFloat16);
    UpdateHyper hs = h;
    hs.seed = seed;
    if (cut == 0) {
      EXPECT_TRUE(scalar_update({b.span()}, hs).ok());
    } else {  // the tail [cut, n) on its own, its elements keeping their indices
      UpdateSpan head = b.span();
      head.n = cut;
      EXPECT_TRUE(scalar_update({head}, hs).ok());
      EXPECT_TRUE(scalar_update({b.span(cut, cut)}, hs).ok());
    }
    return b;
  };
  const Buffers a = bf16_run(5, 0);
  EXPECT_TRUE(same_bits(a.p, wide.p)) << "the master uses the unrounded state";
  for (const auto& [low, full] : {std::make_pair(a.m, wide.m), std::make_pair(a.v, wide.v)}) {
    const auto bits = low.view(torch::kInt16).to(torch::kInt32) & 0xFFFF;
    const auto down = full.view(torch::kInt32).bitwise_right_shift(16) & 0xFFFF;  // truncated toward zero
    EXPECT_TRUE(torch::logical_or(bits == down, bits == down + 1).all().item<bool>()) << "not a bf16 neighbour";
    EXPECT_GT((bits == down + 1).sum().item<int64_t>(), 0) << "never rounded away from zero";
    EXPECT_GT((bits == down).sum().item<int64_t>(), 0) << "never rounded toward zero";
  }
  const Buffers again = bf16_run(5, 0);
  EXPECT_TRUE(same_bits(again.m, a.m) && same_bits(again.v, a.v)) << "the same seed rounded differently";
  const Buffers cut = bf16_run(5, 4567);
  EXPECT_TRUE(same_bits(cut.m, a.m) && same_bits(cut.v, a.v)) << "the rounding depends on how the span is cut";
  const Buffers other = bf16_run(6, 0);
  EXPECT_FALSE(same_bits(other.m, a.m)) << "the seed is ignored";
}

TEST(CpuUpdateScalar, ANonFiniteTileIsReportedAtItsIndexInTheWholeParameterSpace) {
  // Span 0: 100 clean elements at index 0. Span 1: two full tiles and a short one (5 elements) at
  // index 1000, a NaN in the short tile.
  Buffers clean(100, Dtype::kF32, Dtype::kF32, 15), dirty(2 * 2048 + 5, Dtype::kBF16, Dtype::kF32, 16);
  dirty.g[4100] = std::numeric_limits<float>::quiet_NaN();
  const Buffers before = dirty.clone();
  UpdateHyper h = hyper_of(kRules[0], 1);
  const UpdateReport r = scalar_update({clean.span(), dirty.span(0, 1000)}, h);
  EXPECT_EQ(r.nonfinite, 1);
  EXPECT_EQ(r.first_nonfinite, 1000 + 4100);
  EXPECT_EQ(r.skipped_tiles, 1);
  EXPECT_TRUE(same_bits(dirty.p.narrow(0, 4096, 5), before.p.narrow(0, 4096, 5))) << "the NaN's tile was written";
  EXPECT_TRUE(dirty.m.narrow(0, 4096, 5).eq(0).all().item<bool>());
  EXPECT_FALSE(dirty.p.narrow(0, 0, 4096).eq(before.p.narrow(0, 0, 4096)).any().item<bool>())
      << "a clean tile was left alone";
  // The report names the first span's first one when both have one.
  Buffers clean2(100, Dtype::kF32, Dtype::kF32, 15), dirty2 = before.clone();
  clean2.g[50] = -std::numeric_limits<float>::infinity();
  const UpdateReport r2 = scalar_update({clean2.span(), dirty2.span(0, 1000)}, h);
  EXPECT_EQ(r2.nonfinite, 2);
  EXPECT_EQ(r2.first_nonfinite, 50);
  EXPECT_EQ(r2.skipped_tiles, 2);
}

TEST(CpuUpdateScalar, AnEmptySpanIsNothingToDo) {
  UpdateSpan empty;  // n = 0, no buffers
  Buffers b(7, Dtype::kF32, Dtype::kF32, 17);
  const auto p0 = b.p.clone();
  const UpdateReport r = scalar_update({empty, b.span(), empty}, hyper_of(kRules[0], 1));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.first_nonfinite, -1);
  EXPECT_FALSE(b.p.eq(p0).any().item<bool>()) << "the span beside the empty ones was not updated";
}

}  // namespace
}  // namespace tandem
