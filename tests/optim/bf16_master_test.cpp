// A bf16 master in the CPU kernels (Note [bf16 master]): every SIMD level against the scalar
// reference bit for bit (stochastic and Kahan, every state dtype, tails), small updates that plain
// rounding would lose landing on average (stochastic) or exactly enough (Kahan), the bf16 copy as
// the master's own bits, rollback of the master and its compensation, and the bytes counted.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../test_util.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/q8_codes.h"

namespace tandem {
namespace {

enum class Kind { kStochastic, kKahan };

// The message of the error f throws (an internal one: a span is the engine's, not the user's), or "".
std::string internal_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A span's buffers, one element longer than n and used from element 1 (nothing aligned beyond its
// element size): a bf16 master (and compensation), gradient, states in `sd`, the bf16 copy.
struct Buffers {
  torch::Tensor master, comp, grad, m, v, ms, vs, out;
  int64_t n;
  Dtype gd, sd;
  Kind kind;

  Buffers(int64_t n_, Kind k, Dtype g, Dtype s, uint64_t seed) : n(n_), gd(g), sd(s), kind(k) {
    torch::manual_seed(seed);
    const auto w = torch::randn({n + 1});
    master = w.to(torch::kBFloat16);
    comp = k == Kind::kKahan ? (w - master.to(torch::kFloat32)).to(torch::kBFloat16) : torch::Tensor();
    grad = (torch::randn({n + 1}) * 1e-2).to(g == Dtype::kF32 ? torch::kFloat32 : torch::kBFloat16);
    const auto m0 = torch::randn({n + 1}) * 1e-3, v0 = torch::rand({n + 1}) * 1e-4;
    if (s == Dtype::kQ8) {
      m = torch::zeros({n + 1}, torch::kInt8);
      v = torch::zeros({n + 1}, torch::kUInt8);
      ms = torch::zeros({q8::scale_count(n) + 1});
      vs = torch::zeros({q8::scale_count(n) + 1});
      q8::encode(m0.data_ptr<float>(), v0.data_ptr<float>(), n, m.data_ptr<int8_t>() + 1, v.data_ptr<uint8_t>() + 1,
                 ms.data_ptr<float>() + 1, vs.data_ptr<float>() + 1);
    } else {
      const auto t = s == Dtype::kF32 ? torch::kFloat32 : torch::kBFloat16;
      m = m0.to(t);
      v = v0.to(t);
    }
    out = torch::zeros({n + 1}, torch::kBFloat16);
  }
  Buffers clone() const {
    Buffers b = *this;
    for (auto* t : {&b.master, &b.comp, &b.grad, &b.m, &b.v, &b.ms, &b.vs, &b.out})
      if (t->defined()) *t = t->clone();
    return b;
  }
  static uint16_t* u16(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()) + 1; }
  UpdateSpan span() const {
    UpdateSpan s;
    s.n = n;
    s.master_bf16 = u16(master);
    if (comp.defined()) s.master_comp = u16(comp);
    s.grad = static_cast<char*>(grad.data_ptr()) + grad.element_size();
    s.m = static_cast<char*>(m.data_ptr()) + m.element_size();
    s.v = static_cast<char*>(v.data_ptr()) + v.element_size();
    if (sd == Dtype::kQ8) {
      s.m_scale = ms.data_ptr<float>() + 1;
      s.v_scale = vs.data_ptr<float>() + 1;
    }
    s.bf16_out = u16(out);
    s.grad_dtype = gd;
    s.state_dtype = sd;
    s.index_base = 12345;
    s.weight_decay_scale = 0.5f;
    return s;
  }
};

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

std::string first_difference(const Buffers& a, const Buffers& b) {
  const char* names[] = {"master", "compensation", "m", "v", "m scales", "v scales", "bf16_out"};
  const torch::Tensor xs[] = {a.master, a.comp, a.m, a.v, a.ms, a.vs, a.out};
  const torch::Tensor ys[] = {b.master, b.comp, b.m, b.v, b.ms, b.vs, b.out};
  for (int k = 0; k < 7; ++k)
    if (!same_bits(xs[k], ys[k])) return std::string(names[k]) + " differ";
  return "";
}

UpdateHyper adamw(int64_t step) {
  UpdateHyper h;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  h.step = step;
  h.grad_scale = 0.75;
  h.seed = 99;
  return h;
}

const char* name(Dtype d) { return d == Dtype::kF32 ? "fp32" : d == Dtype::kBF16 ? "bf16" : "int8"; }

TEST(Bf16Master, EveryKernelLevelGivesTheScalarReferencesBits) {
  for (const Kind kind : {Kind::kStochastic, Kind::kKahan})
    for (const Dtype sd : {Dtype::kF32, Dtype::kBF16, Dtype::kQ8})
      for (const Dtype gd : {Dtype::kF32, Dtype::kBF16}) {
        SCOPED_TRACE(std::string(kind == Kind::kKahan ? "kahan" : "stochastic") + ", states " + name(sd) +
                     ", grads " + name(gd));
        const Buffers start(5000, kind, gd, sd, 3);  // two full tiles and a tail of 904
        Buffers want = start.clone();
        for (int64_t step = 1; step <= 3; ++step) cpu_update({want.span()}, adamw(step), nullptr, nullptr, CpuIsa::kScalar);
        EXPECT_FALSE(same_bits(want.master, start.master)) << "the update changed nothing";
        for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
          if (static_cast<int>(isa) > static_cast<int>(best_cpu_isa())) continue;
          Buffers got = start.clone();
          for (int64_t step = 1; step <= 3; ++step) cpu_update({got.span()}, adamw(step), nullptr, nullptr, isa);
          EXPECT_EQ(first_difference(got, want), "") << to_string(isa);
        }
        // The copy for the device is the master's own bits, and the element before the span is untouched.
        EXPECT_TRUE(same_bits(want.out.narrow(0, 1, want.n), want.master.narrow(0, 1, want.n)));
        EXPECT_TRUE(same_bits(want.master.narrow(0, 0, 1), start.master.narrow(0, 0, 1)));
      }
}

// 200 SGD steps of -1e-4 each on weights at 1.0, where a bf16 step is 2^-8 below and 2^-7 above:
// rounded to nearest every update would be lost (the weights would stay 1.0).
TEST(Bf16Master, UpdatesBelowHalfABf16StepLandOnAverageOrThroughTheCompensation) {
  constexpr int64_t n = 65536;
  constexpr int steps = 200;
  const double want = 1.0 - steps * 1e-4;
  for (const Kind kind : {Kind::kStochastic, Kind::kKahan}) {
    SCOPED_TRACE(kind == Kind::kKahan ? "kahan" : "stochastic");
    auto master = torch::ones({n}, torch::kBFloat16), comp = torch::zeros({n}, torch::kBFloat16);
    auto grad = torch::ones({n}), out = torch::zeros({n}, torch::kBFloat16);
    UpdateSpan s;
    s.n = n;
    s.master_bf16 = reinterpret_cast<uint16_t*>(master.data_ptr());
    if (kind == Kind::kKahan) s.master_comp = reinterpret_cast<uint16_t*>(comp.data_ptr());
    s.grad = grad.data_ptr();
    s.bf16_out = reinterpret_cast<uint16_t*>(out.data_ptr());
    UpdateHyper h;
    h.rule = UpdateRule::kSgd;
    h.lr = 1e-4;
    h.beta1 = 0.0;  // plain SGD: no state
    h.seed = 5;
    for (int step = 1; step <= steps; ++step) {
      h.step = step;
      ASSERT_TRUE(cpu_update({s}, h).ok());
    }
    const auto w = master.to(torch::kFloat32);
    if (kind == Kind::kStochastic) {
      // Unbiased: the mean within 6 standard errors (one weight's walk has a spread of about 0.009).
      EXPECT_NEAR(w.mean().item<double>(), want, 2e-4);
      EXPECT_GT(w.lt(1.0).to(torch::kFloat32).mean().item<double>(), 0.95) << "most weights moved";
    } else {
      // The pair holds the sum to about 16 bits (the compensation's own rounding drifts it by about
      // 1e-4 over these 200 updates, against 0.02 lost by plain rounding); the bf16 part is the
      // nearest bf16 step.
      const auto full = w + comp.to(torch::kFloat32);
      EXPECT_LT((full - want).abs().max().item<double>(), 5e-4);
      EXPECT_LE((w - want).abs().max().item<double>(), 0.0039063 / 2 + 1e-6);
    }
    EXPECT_TRUE(same_bits(out, master));
  }
}

// 100 AdamW updates from one start and the same gradients: a Kahan master's pair stays within
// 2^-16 of the weights' scale per update's rounding, grown as a random walk (sqrt(100) = 10 of them:
// the compensation's own rounding adds up, as the fp32 master's does 2^-8 as much); a stochastically
// rounded one drifts as a random walk of bf16 steps, a small part of how far the updates moved it.
TEST(Bf16Master, AKahanMasterFollowsTheFp32MasterAndAStochasticOneStaysNear) {
  constexpr int64_t n = 8192;
  torch::manual_seed(4);
  const auto w0 = torch::randn({n}) * 0.02;
  auto f32 = w0.to(torch::kBFloat16).to(torch::kFloat32);  // a start every master holds exactly
  auto hi_k = f32.to(torch::kBFloat16), lo_k = torch::zeros({n}, torch::kBFloat16), hi_s = hi_k.clone();
  std::vector<torch::Tensor> m(3), v(3);
  for (int k = 0; k < 3; ++k) m[k] = torch::zeros({n}), v[k] = torch::zeros({n});
  const auto u16 = [](torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
  UpdateHyper h;
  h.lr = 3e-4;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  for (int step = 1; step <= 100; ++step) {
    auto g = torch::randn({n}) * 1e-2;
    h.step = step;
    std::vector<UpdateSpan> spans(3);
    for (int k = 0; k < 3; ++k) {
      spans[k].n = n;
      spans[k].grad = g.data_ptr();
      spans[k].m = m[k].data_ptr();
      spans[k].v = v[k].data_ptr();
    }
    spans[0].master = f32.data_ptr<float>();
    spans[1].master_bf16 = u16(hi_k);
    spans[1].master_comp = u16(lo_k);
    spans[2].master_bf16 = u16(hi_s);
    ASSERT_TRUE(cpu_update(spans, h).ok());
  }
  const double moved = (f32 - w0).abs().mean().item<double>();
  ASSERT_GT(moved, 1e-3) << "the updates should move the weights by many bf16 steps";
  const auto kahan = hi_k.to(torch::kFloat32) + lo_k.to(torch::kFloat32);
  const double scale = f32.abs().max().item<double>();
  const double kahan_off = (kahan - f32).abs().max().item<double>();
  EXPECT_LT(kahan_off, scale * std::ldexp(1.0, -16) * 10);
  EXPECT_GT(kahan_off, 0.0) << "the pair is not the fp32 master";
  const double sr = (hi_s.to(torch::kFloat32) - f32).abs().mean().item<double>();
  EXPECT_LT(sr, 0.25 * moved) << "stochastic rounding drifts a small part of the way the updates moved";
  EXPECT_GT(sr, 10 * kahan_off) << "and far more than Kahan's pair";
}

// Updates smaller than a bf16 step (SGD, lr 3e-5, random gradients: about half a step of weights
// near 0.02) for 100 steps: the Kahan pair follows the fp32 master within 2^-16 of the weights'
// scale per rounding, grown as a random walk. A compensation rounded toward zero at every update
// (an earlier version) drifts toward the bf16 grid: in a NumPy model of this run 3.3e-5 apart at
// most, 2.7x this bound (rounded to nearest: 5.2e-6).
TEST(Bf16Master, SmallUpdatesDoNotPullAKahanPairTowardTheBf16Grid) {
  constexpr int64_t n = 8192;
  torch::manual_seed(9);
  auto f32 = (torch::randn({n}) * 0.02).to(torch::kBFloat16).to(torch::kFloat32);
  auto hi = f32.to(torch::kBFloat16), lo = torch::zeros({n}, torch::kBFloat16);
  UpdateHyper h;
  h.rule = UpdateRule::kSgd;
  h.lr = 3e-5;
  h.beta1 = 0.0;
  for (int step = 1; step <= 100; ++step) {
    auto g = torch::randn({n});
    h.step = step;
    std::vector<UpdateSpan> spans(2);
    for (auto& s : spans) {
      s.n = n;
      s.grad = g.data_ptr();
    }
    spans[0].master = f32.data_ptr<float>();
    spans[1].master_bf16 = reinterpret_cast<uint16_t*>(hi.data_ptr());
    spans[1].master_comp = reinterpret_cast<uint16_t*>(lo.data_ptr());
    ASSERT_TRUE(cpu_update(spans, h).ok());
  }
  const auto pair = hi.to(torch::kFloat32) + lo.to(torch::kFloat32);
  const double off = (pair - f32).abs().max().item<double>();
  EXPECT_LT(off, f32.abs().max().item<double>() * std::ldexp(1.0, -16) * 10);
  EXPECT_TRUE(torch::equal(hi, pair.to(torch::kBFloat16))) << "the bf16 part is the pair's sum rounded to nearest";
  EXPECT_LT(hi.ne(f32.to(torch::kBFloat16)).sum().item<int64_t>(), n / 100) << "and almost always the fp32 master's";
}

TEST(Bf16Master, RollbackRestoresTheMasterItsCompensationAndTheCopy) {
  for (const Kind kind : {Kind::kStochastic, Kind::kKahan})
    for (const Dtype sd : {Dtype::kBF16, Dtype::kQ8}) {
      SCOPED_TRACE(std::string(kind == Kind::kKahan ? "kahan, " : "stochastic, ") + name(sd));
      Buffers b(4100, kind, Dtype::kBF16, sd, 11);
      cpu_update({b.span()}, adamw(1));  // the copy now holds the master's bits
      const Buffers before = b.clone();
      Buffers log = b.clone();  // same shapes: the undo log's buffers
      UndoLog u;
      const UpdateSpan ls = log.span();
      u.master_bf16 = ls.master_bf16;
      u.master_comp = ls.master_comp;
      u.m = ls.m;
      u.v = ls.v;
      u.m_scale = ls.m_scale;
      u.v_scale = ls.v_scale;
      const std::vector<UndoLog> undo = {u};
      cpu_update({b.span()}, adamw(2), &undo);
      ASSERT_NE(first_difference(b, before), "");
      cpu_rollback({b.span()}, undo);
      EXPECT_EQ(first_difference(b, before), "");
    }
}

TEST(Bf16Master, BytesPerElementCountTheMastersBytes) {
  // bf16 grads, int8 states, bf16 out: the gradient 2, m and v read and written 4, the copy 2, and
  // the master read and written: 4 in bf16, 8 in fp32 or bf16 with its compensation.
  EXPECT_EQ(bytes_per_element(UpdateRule::kAdamW, Dtype::kBF16, Dtype::kQ8, true, 2), 12);
  EXPECT_EQ(bytes_per_element(UpdateRule::kAdamW, Dtype::kBF16, Dtype::kQ8, true), 16);
  EXPECT_EQ(bytes_per_element(UpdateRule::kAdamW, Dtype::kBF16, Dtype::kQ8, true, 4), 16);
}

TEST(Bf16Master, ASpanWithTwoMastersOrACompensationAloneIsRefused) {
  Buffers b(64, Kind::kKahan, Dtype::kF32, Dtype::kF32, 1);
  auto f32 = torch::zeros({64});
  UpdateSpan s = b.span();
  s.master = f32.data_ptr<float>();
  EXPECT_NE(internal_error_of([&] { cpu_update({s}, adamw(1)); }).find("one master"), std::string::npos);
  s = b.span();
  s.master = f32.data_ptr<float>();
  s.master_bf16 = nullptr;
  EXPECT_NE(internal_error_of([&] { cpu_update({s}, adamw(1)); }).find("compensation without a bf16 master"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
