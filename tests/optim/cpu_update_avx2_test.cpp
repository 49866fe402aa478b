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
#include "isa_kernels.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {
namespace {

using test::Buffers;
using test::first_difference;
using test::hyper_for;
using test::IsaGuard;
using test::report_text;
using test::torch_type;

bool cpu_runs_avx2() {
  IsaGuard restore;
  return test::error_of([] { set_cpu_isa(CpuIsa::kAvx2); }).empty();
}

#define SKIP_WITHOUT_AVX2() \
  if (!cpu_runs_avx2()) GTEST_SKIP() << "this CPU (or build) cannot run the AVX2 + FMA kernels"

constexpr uint64_t kSeed = 77;  // stochastic rounding's seed in these tests

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
          const UpdateHyper h = hyper_for(c.rule, c.rnd, step, kSeed);
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
        UpdateHyper h = hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 2, kSeed);
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
        const UpdateHyper h = hyper_for(rule, Rounding::kStochastic, step, kSeed);
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
    const UpdateReport r = cpu_update({b.span()}, hyper_for(UpdateRule::kAdamW, Rounding::kStochastic, 3, kSeed), &undo,
                                      nullptr, CpuIsa::kAvx2);
    EXPECT_EQ(r.nonfinite, 1);
    EXPECT_NE(first_difference(b, before), "") << "offset " << offset << ": nothing was updated";
    cpu_rollback({b.span()}, undo);
    EXPECT_EQ(first_difference(b, before), "") << "offset " << offset;
  }
}

}  // namespace
}  // namespace tandem
