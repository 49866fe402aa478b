// The AVX2 + FMA update kernels against the scalar reference, bit for bit: streamed and unaligned bf16
// copies, non-finite gradients wherever a tile scan meets them, stochastic rounding under any index
// base, bf16 conversion of every bit pattern, and rollback. Skipped without AVX2 and FMA.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../test_util.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {
namespace {

// Puts the process's kernel level back at scope exit.
class IsaGuard {
 public:
  IsaGuard() : prev_(active_cpu_isa()) {}
  ~IsaGuard() { set_cpu_isa(prev_); }

 private:
  CpuIsa prev_;
};

bool cpu_runs_avx2() {
  IsaGuard restore;
  return test::error_of([] { set_cpu_isa(CpuIsa::kAvx2); }).empty();
}

#define SKIP_WITHOUT_AVX2() \
  if (!cpu_runs_avx2()) GTEST_SKIP() << "this CPU (or build) cannot run the AVX2 + FMA kernels"

torch::ScalarType torch_type(Dtype d) { return d == Dtype::kF32 ? torch::kFloat32 : torch::kBFloat16; }

// One span's buffers, used from element `offset` of each allocation: offset 0 leaves the bf16
// copy 64-byte aligned (the kernels stream it), offset 3 misaligns every buffer.
struct Buffers {
  torch::Tensor master, grad, m, v, out;
  int64_t n, offset;
  Dtype gd, sd;

  Buffers(int64_t n_, int64_t offset_, Dtype g, Dtype s, uint64_t seed) : n(n_), offset(offset_), gd(g), sd(s) {
    torch::manual_seed(seed);
    master = torch::randn({n + offset});
    grad = (torch::randn({n + offset}) * 1e-2).to(torch_type(g));
    m = (torch::randn({n + offset}) * 1e-3).to(torch_type(s));
    v = (torch::rand({n + offset}) * 1e-4).to(torch_type(s));
    out = torch::zeros({n + offset}, torch::kBFloat16);
  }
  Buffers clone() const {
    Buffers b = *this;
    b.master = master.clone(), b.grad = grad.clone(), b.m = m.clone(), b.v = v.clone(), b.out = out.clone();
    return b;
  }
  UpdateSpan span(int64_t index_base = 0) const {
    UpdateSpan s;
    s.n = n;
    s.index_base = index_base;
    s.master = master.data_ptr<float>() + offset;
    s.grad = static_cast<char*>(grad.data_ptr()) + offset * grad.element_size();
    s.m = static_cast<char*>(m.data_ptr()) + offset * m.element_size();
    s.v = static_cast<char*>(v.data_ptr()) + offset * v.element_size();
    s.bf16_out = reinterpret_cast<uint16_t*>(out.data_ptr()) + offset;
    s.grad_dtype = gd;
    s.state_dtype = sd;
    s.weight_decay_scale = 0.5f;
    return s;
  }
  /// The gradient element i of the span (an fp32 value, stored in the gradient's dtype).
  void set_grad(int64_t i, float x) { grad[offset + i] = x; }
};

// "" when every buffer agrees bit for bit, else the first difference.
std::string first_difference(const Buffers& a, const Buffers& b) {
  const char* names[] = {"master", "m", "v", "bf16 copy"};
  const torch::Tensor xs[] = {a.master, a.m, a.v, a.out}, ys[] = {b.master, b.m, b.v, b.out};
  for (int k = 0; k < 4; ++k) {
    const int64_t bytes = xs[k].numel() * xs[k].element_size();
    if (std::memcmp(xs[k].data_ptr(), ys[k].data_ptr(), bytes) == 0) continue;
    const auto int_type = xs[k].element_size() == 4 ? torch::kInt32 : torch::kInt16;
    const auto ne = (xs[k].view(int_type) != ys[k].view(int_type)).nonzero();
    const int64_t i = ne[0][0].item<int64_t>();
    return std::string(names[k]) + " differs first at element " + std::to_string(i - a.offset) + ": " +
           std::to_string(xs[k][i].item<double>()) + " vs " + std::to_string(ys[k][i].item<double>()) + " (" +
           std::to_string(ne.size(0)) + " elements differ)";
  }
  return "";
}

UpdateHyper hyper_for(UpdateRule rule, Rounding rounding, int64_t step) {
  UpdateHyper h;
  h.rule = rule;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = rule == UpdateRule::kLion ? 0.99 : 0.95;
  h.weight_decay = 0.1;
  h.dampening = rule == UpdateRule::kSgd ? 0.1 : 0.0;
  h.step = step;
  h.grad_scale = 0.75;
  h.rounding = rounding;
  h.seed = 77;
  return h;
}

std::string report_text(const UpdateReport& r) {
  return "nonfinite " + std::to_string(r.nonfinite) + ", first " + std::to_string(r.first_nonfinite) +
         ", skipped tiles " + std::to_string(r.skipped_tiles);
}

struct Combo {
  UpdateRule rule;
  Dtype gd, sd;
  Rounding rnd;
};

std::vector<Combo> all_combos() {
  std::vector<Combo> out;
  for (UpdateRule rule : {UpdateRule::kAdamW, UpdateRule::kAdam, UpdateRule::kSgd, UpdateRule::kLion})
    for (Dtype gd : {Dtype::kF32, Dtype::kBF16}) {
      out.push_back({rule, gd, Dtype::kF32, Rounding::kNearestEven});
      out.push_back({rule, gd, Dtype::kBF16, Rounding::kNearestEven});
      out.push_back({rule, gd, Dtype::kBF16, Rounding::kStochastic});
    }
  return out;
}

TEST(CpuUpdateAvx2, AlignedAndUnalignedBuffersMatchTheScalarReferenceBitForBit) {
  SKIP_WITHOUT_AVX2();
  CpuThreadPool pool(2);
  int cases = 0;
  for (const int64_t n : {8, 2048, 3 * 2048 + 8, 65536 + 17, 1000003})
    for (const int64_t offset : {0, 3})
      for (const Combo& c : all_combos()) {
        // The million-element run for two combinations only: the short ones cover the rest.
        if (n == 1000003 && !((c.rule == UpdateRule::kAdamW && c.gd == Dtype::kBF16 && c.sd == Dtype::kBF16 &&
                               c.rnd == Rounding::kStochastic) ||
                              (c.rule == UpdateRule::kLion && c.gd == Dtype::kF32 && c.sd == Dtype::kF32)))
          continue;
        SCOPED_TRACE(::testing::Message() << "n=" << n << " offset " << offset << " rule " << int(c.rule) << " grad "
                                          << int(c.gd) << " state " << int(c.sd) << " rounding " << int(c.rnd));
        const Buffers start(n, offset, c.gd, c.sd, 5 + n);
        Buffers ref = start.clone(), fast = start.clone();
        for (int64_t step = 1; step <= 3; ++step) {
          const UpdateHyper h = hyper_for(c.rule, c.rnd, step);
          ASSERT_TRUE(cpu_update({ref.span()}, h, nullptr, &pool, CpuIsa::kScalar).ok());
          ASSERT_TRUE(cpu_update({fast.span()}, h, nullptr, &pool, CpuIsa::kAvx2).ok());
        }
        EXPECT_EQ(first_difference(fast, ref), "");
        EXPECT_FALSE(torch::equal(ref.master, start.master)) << "the update changed nothing";
        ++cases;
      }
  EXPECT_GT(cases, 0);
}

// Chunks of 65536 elements, tiles of 2048, 8 lanes: n = 65536 + 2048 + 13 has a second chunk of a
// full tile and a tile of 13 (8 in vectors, 5 in the padded tail).
TEST(CpuUpdateAvx2, NonFiniteGradientsAnywhereAreFoundAsTheScalarPathFindsThem) {
  SKIP_WITHOUT_AVX2();
  const int64_t n = 65536 + 2048 + 13;
  const int64_t tail0 = 65536 + 2048;
  const std::vector<std::vector<int64_t>> placements = {
      {0},          {7},          {2047},         {2048},
      {4100},       {65535},      {65536},        {65536 + 2047},
      {tail0},      {tail0 + 7},  {tail0 + 8},    {tail0 + 12},
      {2048, 4096}, {4095, 4096}, {65535, 65536}, {tail0 - 1, tail0 + 12}};
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  int cases = 0;
  for (const Dtype gd : {Dtype::kF32, Dtype::kBF16})
    for (const float bad : {nan, -inf, 3e38f}) {  // 3e38 is finite until the scale of 4 overflows it
      for (const auto& where : placements) {
        SCOPED_TRACE(::testing::Message() << "grad " << int(gd) << " value " << bad << " at " << where[0]
                                          << (where.size() > 1 ? " and " + std::to_string(where[1]) : ""));
        Buffers start(n, 0, gd, Dtype::kF32, 31);
        for (const int64_t i : where) start.set_grad(i, bad);
        Buffers ref = start.clone(), fast = start.clone();
        UpdateHyper h = hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 2);
        // NaN and Inf: a scale within 1, so the raw-bit scans alone decide (Note [Look-ahead gradient
        // scan]); 3e38: a scale that overflows it, so the exact count decides.
        h.grad_scale = std::isfinite(bad) ? 4.0 : 0.75;
        const UpdateReport r_ref = cpu_update({ref.span(100)}, h, nullptr, nullptr, CpuIsa::kScalar);
        const UpdateReport r_fast = cpu_update({fast.span(100)}, h, nullptr, nullptr, CpuIsa::kAvx2);
        EXPECT_EQ(report_text(r_fast), report_text(r_ref));
        EXPECT_EQ(r_ref.nonfinite, static_cast<int64_t>(where.size()));
        EXPECT_EQ(r_ref.first_nonfinite, 100 + where[0]);
        EXPECT_EQ(first_difference(fast, ref), "");
        ++cases;
      }
    }
  EXPECT_EQ(cases, 2 * 3 * 16);
}

TEST(CpuUpdateAvx2, StochasticRoundingKeepsEachElementsIndexUnderAnyIndexBase) {
  SKIP_WITHOUT_AVX2();
  for (const int64_t base : {int64_t{3}, (int64_t{1} << 32) - 5, (int64_t{1} << 32) + 1})
    for (const UpdateRule rule : {UpdateRule::kAdamW, UpdateRule::kSgd, UpdateRule::kLion}) {
      SCOPED_TRACE(::testing::Message() << "index base " << base << " rule " << int(rule));
      const Buffers start(1003, 3, Dtype::kBF16, Dtype::kBF16, 41);
      Buffers ref = start.clone(), fast = start.clone();
      for (int64_t step = 1; step <= 2; ++step) {
        const UpdateHyper h = hyper_for(rule, Rounding::kStochastic, step);
        ASSERT_TRUE(cpu_update({ref.span(base)}, h, nullptr, nullptr, CpuIsa::kScalar).ok());
        ASSERT_TRUE(cpu_update({fast.span(base)}, h, nullptr, nullptr, CpuIsa::kAvx2).ok());
      }
      EXPECT_EQ(first_difference(fast, ref), "");
    }
}

// Random bit patterns hold NaNs (signalling, quiet, either sign), infinities, subnormals, ties and
// values that round up to infinity; sizes leave a scalar tail after the vectors.
TEST(CpuUpdateAvx2, Bf16ConversionOfEveryKindOfValueMatchesTheScalarConversion) {
  SKIP_WITHOUT_AVX2();
  IsaGuard restore;
  torch::manual_seed(51);
  const auto bits = torch::randint(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), {1000003},
                                   torch::kInt32);
  auto src = bits.view(torch::kFloat32).clone();
  const std::vector<uint32_t> special = {0x7F800001u, 0xFFC00001u, 0x7FC00000u, 0x7F800000u, 0xFF800000u,
                                         0x00000001u, 0x807FFFFFu, 0x3F808000u, 0x3F818000u, 0x7F7FFFFFu,
                                         0x80000000u, 0x00000000u, 0x3F80FFFFu, 0x7F7F8000u};
  std::memcpy(src.data_ptr<float>(), special.data(), special.size() * sizeof(uint32_t));
  for (const int64_t n : {1, 7, 17, 1000003}) {
    std::vector<uint16_t> scalar(n), avx2(n);
    set_cpu_isa(CpuIsa::kScalar);
    cpu_to_bf16(src.data_ptr<float>(), scalar.data(), n);
    set_cpu_isa(CpuIsa::kAvx2);
    cpu_to_bf16(src.data_ptr<float>(), avx2.data(), n);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < n; ++i)
      if (scalar[i] != avx2[i]) {
        if (first < 0) first = i;
        ++differ;
      }
    EXPECT_EQ(differ, 0) << "n=" << n << ": first at " << first << ", input bits " << std::hex
                         << (first >= 0 ? bits[first].item<int32_t>() : 0);
  }
}

TEST(CpuUpdateAvx2, RollbackRestoresTheStateAndRewritesTheBf16Copy) {
  SKIP_WITHOUT_AVX2();
  IsaGuard restore;
  set_cpu_isa(CpuIsa::kAvx2);  // cpu_rollback's bf16 copy uses the active level
  for (const int64_t offset : {0, 3}) {
    Buffers b(70001, offset, Dtype::kBF16, Dtype::kBF16, 61);
    cpu_to_bf16(b.master.data_ptr<float>(), reinterpret_cast<uint16_t*>(b.out.data_ptr()), b.master.numel());
    const Buffers before = b.clone();
    auto um = torch::empty_like(b.master), mm = torch::empty_like(b.m), vv = torch::empty_like(b.v);
    const std::vector<UndoLog> undo = {{um.data_ptr<float>() + offset,
                                        static_cast<char*>(mm.data_ptr()) + offset * mm.element_size(),
                                        static_cast<char*>(vv.data_ptr()) + offset * vv.element_size()}};
    b.set_grad(66000, std::numeric_limits<float>::quiet_NaN());
    const UpdateReport r =
        cpu_update({b.span()}, hyper_for(UpdateRule::kAdamW, Rounding::kStochastic, 3), &undo, nullptr, CpuIsa::kAvx2);
    EXPECT_EQ(r.nonfinite, 1);
    EXPECT_NE(first_difference(b, before), "") << "offset " << offset << ": nothing was updated";
    cpu_rollback({b.span()}, undo);
    EXPECT_EQ(first_difference(b, before), "") << "offset " << offset;
  }
}

}  // namespace
}  // namespace tandem
