// 8-bit Adam states (Note [8-bit states]): the codes' precision and range, the kernels of every SIMD
// level against the scalar reference bit for bit (codes rounded to nearest and stochastically), the
// update against dequantise + fp32 update + quantise, non-finite tiles and rollback, AdamW with
// 8-bit states tracking fp32 states, and stochastic codes following a shrinking v that nearest
// codes hold (Note [8-bit stochastic codes]).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../test_util.h"
#include "tandem/core/thread_pool.h"
#include "tandem/kernels/bf16_rounding.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/q8_codes.h"

namespace tandem {
namespace {

// A span's master, gradient, codes, scales and bf16 copy, one element longer than n and used from
// element 1, so nothing is aligned beyond its element size; the states start from fp32 values.
// `wide`: the states' magnitudes spread over 40 octaves (past the codes' 16), the first block's
// states zero (fresh ones), and a stretch of zero gradients.
struct Q8Buffers {
  torch::Tensor master, grad, mq, vq, ms, vs, out;
  int64_t n;
  Dtype gd;

  Q8Buffers(int64_t n_, Dtype g, uint64_t seed, bool wide = false) : n(n_), gd(g) {
    torch::manual_seed(seed);
    master = torch::randn({n + 1});
    auto g32 = torch::randn({n + 1}) * 1e-2;
    auto m = torch::randn({n}) * 1e-3, v = torch::rand({n}) * 1e-4;
    if (wide) {
      const auto octaves = torch::pow(2.0, -torch::randint(0, 40, {n}).to(torch::kFloat32));
      m = m * octaves;
      v = v * octaves * octaves;
      m.narrow(0, 0, std::min<int64_t>(n, q8::kBlock)).zero_();
      v.narrow(0, 0, std::min<int64_t>(n, q8::kBlock)).zero_();
      g32.narrow(0, 1 + n / 2, std::min<int64_t>(n / 4, 3 * q8::kBlock)).zero_();
    }
    grad = g32.to(g == Dtype::kF32 ? torch::kFloat32 : torch::kBFloat16);
    mq = torch::zeros({n + 1}, torch::kInt8);
    vq = torch::zeros({n + 1}, torch::kUInt8);
    ms = torch::zeros({q8::scale_count(n) + 1});
    vs = torch::zeros({q8::scale_count(n) + 1});
    q8::encode(m.data_ptr<float>(), v.data_ptr<float>(), n, mq.data_ptr<int8_t>() + 1, vq.data_ptr<uint8_t>() + 1,
               ms.data_ptr<float>() + 1, vs.data_ptr<float>() + 1);
    out = torch::zeros({n + 1}, torch::kBFloat16);
  }
  Q8Buffers clone() const {
    Q8Buffers b = *this;
    for (auto* t : {&b.master, &b.grad, &b.mq, &b.vq, &b.ms, &b.vs, &b.out}) *t = t->clone();
    return b;
  }
  UpdateSpan span() const {
    UpdateSpan s;
    s.n = n;
    s.master = master.data_ptr<float>() + 1;
    s.grad = static_cast<char*>(grad.data_ptr()) + grad.element_size();
    s.m = mq.data_ptr<int8_t>() + 1;
    s.v = vq.data_ptr<uint8_t>() + 1;
    s.m_scale = ms.data_ptr<float>() + 1;
    s.v_scale = vs.data_ptr<float>() + 1;
    s.bf16_out = reinterpret_cast<uint16_t*>(out.data_ptr()) + 1;
    s.grad_dtype = gd;
    s.state_dtype = Dtype::kQ8;
    s.weight_decay_scale = 0.5f;
    return s;
  }
  /// fp32 m and v decoded from the codes.
  std::pair<torch::Tensor, torch::Tensor> decoded() const {
    auto m = torch::empty({n}), v = torch::empty({n});
    q8::decode(mq.data_ptr<int8_t>() + 1, vq.data_ptr<uint8_t>() + 1, ms.data_ptr<float>() + 1,
               vs.data_ptr<float>() + 1, n, m.data_ptr<float>(), v.data_ptr<float>());
    return {m, v};
  }
};

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

std::string first_difference(const Q8Buffers& a, const Q8Buffers& b) {
  const char* names[] = {"master", "m codes", "v codes", "m scales", "v scales", "bf16_out"};
  const torch::Tensor xs[] = {a.master, a.mq, a.vq, a.ms, a.vs, a.out},
                      ys[] = {b.master, b.mq, b.vq, b.ms, b.vs, b.out};
  for (int k = 0; k < 6; ++k)
    if (!same_bits(xs[k], ys[k]))
      return std::string(names[k]) + " differ in " + std::to_string(xs[k].ne(ys[k]).sum().item<int64_t>()) +
             " elements";
  return "";
}

UpdateHyper adamw(int64_t step, UpdateRule rule = UpdateRule::kAdamW, Rounding rounding = Rounding::kNearestEven) {
  UpdateHyper h;
  h.rule = rule;
  h.rounding = rounding;
  h.seed = 0x5EEDu;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  h.step = step;
  h.grad_scale = 0.75;
  return h;
}

TEST(Q8States, CodesKeepTheirRelativePrecisionOverSixteenOctaves) {
  // Magnitudes from the block's scale down to 2^-15 of it: m within 1/16, sqrt(v) within 1/32.
  const float scale = 3.7f, inv = q8::inverse(scale);
  for (int i = 0; i <= 3000; ++i) {
    const float r = std::ldexp(1.0f + (i % 97) / 97.0f, -(i % 15) - 1);  // (2^-15, 1]
    const float m = (i % 2 ? -1.0f : 1.0f) * r * scale;
    const float back = q8::decode_m(q8::encode_m(m, inv), scale);
    EXPECT_LE(std::abs(back - m), std::abs(m) / 16 * 1.0001f) << m;
    EXPECT_EQ(std::signbit(back), std::signbit(m));
    const float u = r * scale;
    const float uback = std::sqrt(q8::decode_v(q8::encode_u(u, inv), scale));
    EXPECT_LE(std::abs(uback - u), u / 32 * 1.0001f) << u;
  }
  EXPECT_EQ(q8::decode_m(q8::encode_m(scale, inv), scale), scale);  // the block's largest is exact
  EXPECT_EQ(q8::decode_m(q8::encode_m(-scale, inv), scale), -scale);
  EXPECT_FLOAT_EQ(std::sqrt(q8::decode_v(q8::encode_u(scale, inv), scale)), scale);
}

TEST(Q8States, TinyValuesBecomeZeroForMAndTheSmallestCodeForV) {
  const float scale = 1.0f, inv = q8::inverse(scale);
  EXPECT_EQ(q8::encode_m(1e-7f, inv), 0);
  EXPECT_EQ(q8::decode_m(0, scale), 0.0f);
  // A sqrt(v) far below the block's largest is stored as 2^-16 of it, never 0: the update's
  // denominator can only grow.
  EXPECT_EQ(q8::encode_u(1e-9f, inv), 0);
  EXPECT_EQ(q8::encode_u(0.0f, inv), 0);
  EXPECT_GT(q8::decode_v(0, scale), 0.0f);
  EXPECT_NEAR(std::sqrt(q8::decode_v(0, scale)), std::ldexp(1.0f + 1.0f / 16, -16), 1e-12);
  // A block of zeros (or one too small for a normal fp32 scale) has scale 0 and decodes to zeros.
  float m[5] = {0, 0, 0, 0, 1e-39f}, u[5] = {0, 0, 0, 0, 0}, ms = -1, vs = -1, dm[5], dv[5];
  int8_t mq[5];
  uint8_t vq[5];
  q8::encode_block(m, u, 5, mq, vq, &ms, &vs);
  EXPECT_EQ(ms, 0.0f);
  EXPECT_EQ(vs, 0.0f);
  q8::decode_block(mq, vq, ms, vs, 5, dm, dv);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dm[i] + dv[i], 0.0f);
}

// Requantising a decoded block gives its codes and scales back exactly (a resume from fp32 copies of
// 8-bit states continues the same run).
TEST(Q8States, DecodedStatesEncodeToTheSameCodes) {
  const Q8Buffers b(5000, Dtype::kF32, 3);
  auto [m, v] = b.decoded();
  Q8Buffers again = b.clone();
  q8::encode(m.data_ptr<float>(), v.data_ptr<float>(), b.n, again.mq.data_ptr<int8_t>() + 1,
             again.vq.data_ptr<uint8_t>() + 1, again.ms.data_ptr<float>() + 1, again.vs.data_ptr<float>() + 1);
  EXPECT_EQ(first_difference(b, again), "");
}

TEST(Q8States, EverySimdLevelMatchesTheScalarReferenceBitForBit) {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16})
    if (test::error_of([&] { set_cpu_isa(isa); }).empty()) isas.push_back(isa);
  set_cpu_isa(best_cpu_isa());
  if (isas.empty()) GTEST_SKIP() << "this CPU has no SIMD level beyond scalar";
  CpuThreadPool pool(2);
  for (int64_t n : {1, 7, 2049, 200003})
    for (UpdateRule rule : {UpdateRule::kAdamW, UpdateRule::kAdam})
      for (Dtype gd : {Dtype::kF32, Dtype::kBF16})
        for (const bool wide : {false, true})
          for (const Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
            const Q8Buffers start(n, gd, 11 + n, wide);
            Q8Buffers ref = start.clone();
            for (int64_t step = 1; step <= 3; ++step)
              cpu_update({ref.span()}, adamw(step, rule, rounding), nullptr, &pool, CpuIsa::kScalar);
            EXPECT_FALSE(torch::equal(ref.master, start.master));
            EXPECT_FALSE(torch::equal(ref.mq, start.mq) && torch::equal(ref.ms, start.ms));
            for (CpuIsa isa : isas) {
              Q8Buffers fast = start.clone();
              for (int64_t step = 1; step <= 3; ++step)
                cpu_update({fast.span()}, adamw(step, rule, rounding), nullptr, &pool, isa);
              EXPECT_EQ(first_difference(fast, ref), "") << to_string(isa) << " n=" << n << " rule=" << int(rule)
                                                         << " grad=" << int(gd) << " wide=" << wide
                                                         << " stochastic=" << (rounding == Rounding::kStochastic);
            }
          }
}

// Note [8-bit stochastic codes]: a value between two codes becomes the upper one with the probability
// of its distance from the lower, so the mean of its codes is the value; a code's own value stays.
TEST(Q8States, StochasticCodesAreTheValueOnAverage) {
  const float scale = 1.0f, inv = q8::inverse(scale);
  for (const float x : {0.3f, 0.61f, 0.0123f, 1.7e-4f}) {
    double m_sum = 0, u_sum = 0;
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) {
      const uint32_t r = detail::random_bits(static_cast<uint32_t>(i), 77u);
      m_sum += q8::decode_m(q8::encode_m(-x, inv, false, r), scale);
      u_sum += q8::decode_u(q8::encode_u(x, inv, false, r), scale);
    }
    EXPECT_NEAR(-m_sum / draws, x, x * 4e-3) << x;
    EXPECT_NEAR(u_sum / draws, x, x * 4e-3) << x;
    // Nearest rounding misses by up to half a code: these values sit away from their codes.
    const float nearest = q8::decode_u(q8::encode_u(x, inv), scale);
    EXPECT_GT(std::fabs(nearest - x), x * 4e-3) << x;
  }
  const float exact = q8::decode_m(q8::encode_m(0.40625f, inv), scale);  // 1.625 * 2^-2: a code
  for (uint32_t r : {0u, 1u, 0xFFFFFFFFu, 0x8000FFFFu}) EXPECT_EQ(q8::decode_m(q8::encode_m(exact, inv, false, r), scale), exact);
}

// The failure that stochastic codes mend: gradients fall to half of what v has seen, so v should
// shrink to a quarter. Rounded to nearest, each step's change of sqrt(v) (under 2.5 % at beta2 =
// 0.95) falls short of half a code once it is small enough, and v stays near three quarters; rounded
// stochastically, the block's mean v follows the fp32 states'. One element of the block keeps the
// scale fixed (its gradient steady at 16, v at 256).
TEST(Q8States, StochasticCodesFollowAShrinkingVThatNearestCodesHold) {
  const int64_t n = q8::kBlock;
  const auto run = [&](Rounding rounding) {
    Q8Buffers b(n, Dtype::kF32, 21);
    auto m = torch::zeros({n}), v = torch::ones({n});
    v[0] = 256.0f;
    q8::encode(m.data_ptr<float>(), v.data_ptr<float>(), n, b.mq.data_ptr<int8_t>() + 1, b.vq.data_ptr<uint8_t>() + 1,
               b.ms.data_ptr<float>() + 1, b.vs.data_ptr<float>() + 1);
    auto g = b.grad.slice(0, 1);
    g.fill_(0.5f);
    g[0] = 16.0f;
    for (int64_t step = 1; step <= 100; ++step) {
      UpdateHyper h = adamw(step, UpdateRule::kAdamW, rounding);
      h.grad_scale = 1.0;
      h.lr = 0.0;  // the states alone
      cpu_update({b.span()}, h);
    }
    return b.decoded().second.slice(0, 1).mean().item<double>();
  };
  const double fp32 = 0.25 + 0.75 * std::pow(0.95, 100);  // v's recurrence from 1 with g^2 = 0.25
  const double nearest = run(Rounding::kNearestEven), stochastic = run(Rounding::kStochastic);
  EXPECT_GT(nearest, 2.0 * fp32) << "nearest codes held v at " << nearest;
  EXPECT_NEAR(stochastic, fp32, 0.05 * fp32);
}

// One update equals: decode the states, the fp32 kernel on them, encode the new states.
TEST(Q8States, AnUpdateIsTheFp32UpdateOfTheDecodedStates) {
  const Q8Buffers start(10007, Dtype::kBF16, 5);
  Q8Buffers q = start.clone();
  cpu_update({q.span()}, adamw(4));

  auto [m, v] = start.decoded();
  Q8Buffers f = start.clone();
  UpdateSpan s = f.span();
  s.state_dtype = Dtype::kF32;
  s.m = m.data_ptr<float>();
  s.v = v.data_ptr<float>();
  s.m_scale = s.v_scale = nullptr;
  cpu_update({s}, adamw(4));
  q8::encode(m.data_ptr<float>(), v.data_ptr<float>(), f.n, f.mq.data_ptr<int8_t>() + 1, f.vq.data_ptr<uint8_t>() + 1,
             f.ms.data_ptr<float>() + 1, f.vs.data_ptr<float>() + 1);
  EXPECT_EQ(first_difference(q, f), "");
}

TEST(Q8States, NonFiniteTilesAreLeftUntouchedAndRollbackRestoresEveryByte) {
  Q8Buffers b(200003, Dtype::kBF16, 4);
  cpu_update({b.span()}, adamw(1));
  cpu_to_bf16(b.master.data_ptr<float>(), reinterpret_cast<uint16_t*>(b.out.data_ptr()), b.n + 1);
  const Q8Buffers before = b.clone();
  const Q8Buffers undo_bufs = b.clone();  // same shapes; its contents are overwritten
  std::vector<UndoLog> undo = {{undo_bufs.master.data_ptr<float>() + 1, undo_bufs.mq.data_ptr<int8_t>() + 1,
                                undo_bufs.vq.data_ptr<uint8_t>() + 1, undo_bufs.ms.data_ptr<float>() + 1,
                                undo_bufs.vs.data_ptr<float>() + 1}};
  b.grad.slice(0, 1)[150000] = std::numeric_limits<float>::infinity();
  b.grad.slice(0, 1)[65537] = std::numeric_limits<float>::quiet_NaN();
  const UpdateReport r = cpu_update({b.span()}, adamw(2), &undo);
  EXPECT_EQ(r.nonfinite, 2);
  EXPECT_EQ(r.first_nonfinite, 65537);
  EXPECT_EQ(r.skipped_tiles, 2);
  // The tiles holding them kept their codes and scales; the others moved on.
  const int64_t t = 150000 / 2048;
  EXPECT_TRUE(
      same_bits(b.mq.slice(0, 1 + t * 2048, 1 + (t + 1) * 2048), before.mq.slice(0, 1 + t * 2048, 1 + (t + 1) * 2048)));
  EXPECT_EQ(b.ms[1 + t].item<float>(), before.ms[1 + t].item<float>());
  EXPECT_NE(first_difference(b, before), "");
  cpu_rollback({b.span()}, undo);
  EXPECT_EQ(first_difference(b, before), "");
}

// AdamW over 300 steps of a noisy quadratic whose minimum spans several octaves: with 8-bit states
// the weights end as near the minimum as with fp32 states (within 2 %) and within a few percent of
// the fp32 run's weights (relative to the distance travelled), without being the same bits (the
// states really are quantised).
TEST(Q8States, AdamWWithEightBitStatesTracksFp32States) {
  const int64_t n = 50000;
  torch::manual_seed(9);
  const auto target = torch::randn({n}) * torch::exp(torch::randn({n}));  // magnitudes over several octaves
  const auto start = torch::zeros({n});
  auto p32 = start.clone(), m32 = torch::zeros({n}), v32 = torch::zeros({n});
  Q8Buffers q(n, Dtype::kF32, 1);
  q.master.slice(0, 1).copy_(start);
  q.mq.zero_(), q.vq.zero_(), q.ms.zero_(), q.vs.zero_();
  UpdateHyper h = adamw(1);
  h.grad_scale = 1.0;
  h.lr = 3e-2;
  for (int64_t step = 1; step <= 300; ++step) {
    const auto noise = torch::randn({n}) * 0.1;
    h.step = step;
    auto g32 = (p32 - target) + noise;
    UpdateSpan s;
    s.n = n, s.master = p32.data_ptr<float>(), s.grad = g32.data_ptr<float>(), s.m = m32.data_ptr<float>();
    s.v = v32.data_ptr<float>(), s.weight_decay_scale = 0.0f;
    cpu_update({s}, h);
    auto gq = (q.master.slice(0, 1) - target) + noise;
    q.grad.slice(0, 1).copy_(gq);
    UpdateSpan sq = q.span();
    sq.weight_decay_scale = 0.0f;
    cpu_update({sq}, h);
  }
  const auto pq = q.master.slice(0, 1);
  EXPECT_FALSE(torch::equal(pq, p32));
  const double drift = (pq - p32).norm().item<double>() / (p32 - start).norm().item<double>();
  EXPECT_LT(drift, 0.1) << "8-bit states drifted " << drift << " of the distance travelled";
  const double err32 = (p32 - target).norm().item<double>(), errq = (pq - target).norm().item<double>();
  EXPECT_LT(errq, err32 * 1.02) << "fp32 states reach " << err32 << ", 8-bit " << errq;
}

TEST(Q8States, ByteModelAndRefusals) {
  EXPECT_EQ(bytes_per_element(UpdateRule::kAdamW, Dtype::kBF16, Dtype::kQ8, true), 16);
  EXPECT_EQ(bytes_per_element(UpdateRule::kAdamW, Dtype::kF32, Dtype::kQ8, false), 16);
  Q8Buffers b(100, Dtype::kF32, 2);
  UpdateSpan s = b.span();
  s.v_scale = nullptr;
  const auto internal_error = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(internal_error([&] { cpu_update({s}, adamw(1)); }).find("without their scales"), std::string::npos);
  UpdateHyper lion = adamw(1, UpdateRule::kLion);
  EXPECT_NE(internal_error([&] { cpu_update({b.span()}, lion); }).find("8-bit states are Adam's"), std::string::npos);
}

}  // namespace
}  // namespace tandem
