// The AVX-512 update kernels, both forms (bf16 conversion in integer arithmetic, and with the
// VCVTNEPS2BF16 instruction), against the scalar reference bit for bit: 16-lane tails and tiles,
// non-finite gradients at lane boundaries, every bf16 conversion case, rollback. Skipped without AVX-512.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
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
using test::OneTorchThread;
using test::report_text;
using test::torch_type;

// The AVX-512 levels this CPU (and build) runs: kAvx512, and kAvx512Bf16 where the CPU has it.
std::vector<CpuIsa> avx512_levels() {
  IsaGuard restore;
  std::vector<CpuIsa> out;
  for (const CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx512Bf16})
    if (test::error_of([&] { set_cpu_isa(isa); }).empty()) out.push_back(isa);
  return out;
}

#define AVX512_LEVELS_OR_SKIP(levels)                                                       \
  const std::vector<CpuIsa> levels = avx512_levels();                                       \
  if (levels.empty()) GTEST_SKIP() << "this CPU (or build) cannot run the AVX-512 kernels"; \
  OneTorchThread one_torch_thread

constexpr uint64_t kSeed = 91;  // stochastic rounding's seed in these tests

// Sizes around the 16 lanes, the 2048-element tile and the 65536-element chunk.
TEST(CpuUpdateAvx512, AlignedAndUnalignedBuffersMatchTheScalarReferenceBitForBit) {
  AVX512_LEVELS_OR_SKIP(levels);
  CpuThreadPool pool(2);
  int cases = 0;
  for (const int64_t n : {1, 15, 16, 17, 2048 + 31, 65536 + 2048 + 16 + 7})
    for (const int64_t offset : {0, 5})
      for (const UpdateRule rule : {UpdateRule::kAdamW, UpdateRule::kAdam, UpdateRule::kSgd, UpdateRule::kLion})
        for (const Dtype gd : {Dtype::kF32, Dtype::kBF16})
          for (const Dtype sd : {Dtype::kF32, Dtype::kBF16})
            for (const Rounding rnd : {Rounding::kNearestEven, Rounding::kStochastic}) {
              if (sd == Dtype::kF32 && rnd == Rounding::kStochastic) continue;
              // Two chunks for one combination of each rule: the short sizes cover the rest.
              const bool two_chunks = (rule == UpdateRule::kAdamW && gd == Dtype::kBF16 && sd == Dtype::kBF16 &&
                                       rnd == Rounding::kStochastic) ||
                                      (rule == UpdateRule::kAdam && gd == Dtype::kF32 && sd == Dtype::kF32) ||
                                      (rule == UpdateRule::kSgd && gd == Dtype::kBF16 && sd == Dtype::kF32) ||
                                      (rule == UpdateRule::kLion && gd == Dtype::kF32 && sd == Dtype::kBF16 &&
                                       rnd == Rounding::kStochastic);
              if (n > 65536 && !two_chunks) continue;
              const Buffers start(n, offset, gd, sd, 3 + n + offset);
              Buffers ref = start.clone();
              for (int64_t step = 1; step <= 3; ++step)
                ASSERT_TRUE(
                    cpu_update({ref.span()}, hyper_for(rule, rnd, step, kSeed), nullptr, &pool, CpuIsa::kScalar).ok());
              EXPECT_FALSE(torch::equal(ref.master, start.master)) << "the update changed nothing";
              for (const CpuIsa isa : levels) {
                SCOPED_TRACE(::testing::Message()
                             << to_string(isa) << " n=" << n << " offset " << offset << " rule " << int(rule)
                             << " grad " << int(gd) << " state " << int(sd) << " rounding " << int(rnd));
                Buffers fast = start.clone();
                for (int64_t step = 1; step <= 3; ++step)
                  ASSERT_TRUE(cpu_update({fast.span()}, hyper_for(rule, rnd, step, kSeed), nullptr, &pool, isa).ok());
                EXPECT_EQ(first_difference(fast, ref), "");
                ++cases;
              }
            }
  EXPECT_EQ(cases, static_cast<int>((5 * 2 * 4 * 2 * 3 + 2 * 4) * levels.size()));
}

// The options the rule table above leaves at one value: SGD without momentum (no state read) and
// with Nesterov, Adam's epsilon, and the unchecked mode (no non-finite scan) over a million elements.
TEST(CpuUpdateAvx512, SgdVariantsAndUncheckedUpdatesMatchTheScalarReference) {
  AVX512_LEVELS_OR_SKIP(levels);
  CpuThreadPool pool(2);
  struct Case {
    const char* what;
    UpdateRule rule;
    double beta1, dampening;
    bool nesterov, check_finite;
    int64_t n;
  };
  const Case cases[] = {{"sgd without momentum", UpdateRule::kSgd, 0.0, 0.0, false, true, 4099},
                        {"sgd nesterov", UpdateRule::kSgd, 0.8, 0.0, true, true, 4099},
                        {"adamw unchecked", UpdateRule::kAdamW, 0.9, 0.0, false, false, 1000003},
                        {"lion unchecked", UpdateRule::kLion, 0.9, 0.0, false, false, 70001}};
  for (const Case& c : cases) {
    const Buffers start(c.n, 5, Dtype::kBF16, Dtype::kBF16, 17);
    Buffers ref = start.clone();
    UpdateHyper h = hyper_for(c.rule, Rounding::kStochastic, 1, kSeed);
    h.beta1 = c.beta1, h.dampening = c.dampening, h.nesterov = c.nesterov, h.check_finite = c.check_finite;
    h.eps = 1e-3;
    for (int64_t step = 1; step <= 3; ++step) {
      h.step = step;
      cpu_update({ref.span()}, h, nullptr, &pool, CpuIsa::kScalar);
    }
    for (const CpuIsa isa : levels) {
      Buffers fast = start.clone();
      for (int64_t step = 1; step <= 3; ++step) {
        h.step = step;
        cpu_update({fast.span()}, h, nullptr, &pool, isa);
      }
      EXPECT_EQ(first_difference(fast, ref), "") << c.what << " " << to_string(isa);
    }
  }
}

// Several spans in one call, one with its group's hyper-parameters and one without weight decay,
// cut into chunks on two threads.
TEST(CpuUpdateAvx512, SeveralSpansWithGroupsMatchTheScalarReference) {
  AVX512_LEVELS_OR_SKIP(levels);
  CpuThreadPool pool(2);
  const Buffers start(200003, 0, Dtype::kF32, Dtype::kBF16, 23);
  GroupHyper group;
  group.lr = 3e-3, group.beta1 = 0.8, group.beta2 = 0.9, group.eps = 1e-6, group.weight_decay = 0.3;
  group.steps_before = 1;
  const auto spans = [&](const Buffers& b) {
    std::vector<UpdateSpan> s = {b.span(0, 0, 70001), b.span(70001, 70001, 33), b.span(70034, 70034, -1)};
    s[1].weight_decay_scale = 0.0f;
    s[2].group = &group;
    return s;
  };
  Buffers ref = start.clone();
  for (int64_t step = 2; step <= 4; ++step)
    ASSERT_TRUE(cpu_update(spans(ref), hyper_for(UpdateRule::kAdamW, Rounding::kStochastic, step, kSeed), nullptr,
                           &pool, CpuIsa::kScalar)
                    .ok());
  for (const CpuIsa isa : levels) {
    Buffers fast = start.clone();
    for (int64_t step = 2; step <= 4; ++step)
      ASSERT_TRUE(cpu_update(spans(fast), hyper_for(UpdateRule::kAdamW, Rounding::kStochastic, step, kSeed), nullptr,
                             &pool, isa)
                      .ok());
    EXPECT_EQ(first_difference(fast, ref), "") << to_string(isa);
  }
}

// Chunks of 65536 elements, tiles of 2048, 16 lanes: n = 65536 + 2048 + 29 has a second chunk of a
// full tile and a tile of 29 (16 in one vector, 13 in the padded tail); n = 13 is a padded tail alone.
TEST(CpuUpdateAvx512, NonFiniteGradientsAtLaneAndTileBoundariesAreFoundAsTheScalarPathFindsThem) {
  AVX512_LEVELS_OR_SKIP(levels);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Layout {
    int64_t n;
    std::vector<std::vector<int64_t>> placements;
  };
  const int64_t tail0 = 65536 + 2048;
  const Layout layouts[] = {{65536 + 2048 + 29,
                             {{0},
                              {15},
                              {16},
                              {2047},
                              {2048},
                              {2048 + 15},
                              {65535},
                              {65536},
                              {65536 + 2047},
                              {tail0},
                              {tail0 + 15},
                              {tail0 + 16},
                              {tail0 + 28},
                              {2048, 4096},
                              {4095, 4096},
                              {65535, 65536},
                              {tail0 - 1, tail0 + 28}}},
                            {13, {{0}, {12}, {3, 9}}}};
  int cases = 0;
  for (const Layout& layout : layouts)
    for (const Dtype gd : {Dtype::kF32, Dtype::kBF16})
      for (const float bad : {nan, -inf, 3e38f}) {  // 3e38 is finite until the scale of 4 overflows it
        const Buffers clean(layout.n, 0, gd, Dtype::kF32, 31);
        for (const auto& where : layout.placements) {
          Buffers start = clean.clone();
          for (const int64_t i : where) start.set_grad(i, bad);
          UpdateHyper h = hyper_for(UpdateRule::kAdamW, Rounding::kNearestEven, 2, kSeed);
          h.grad_scale = std::isfinite(bad) ? 4.0 : 0.75;
          Buffers ref = start.clone();
          const UpdateReport r_ref = cpu_update({ref.span(100)}, h, nullptr, nullptr, CpuIsa::kScalar);
          EXPECT_EQ(r_ref.nonfinite, static_cast<int64_t>(where.size()));
          EXPECT_EQ(r_ref.first_nonfinite, 100 + where[0]);
          for (const CpuIsa isa : levels) {
            SCOPED_TRACE(::testing::Message()
                         << to_string(isa) << " n=" << layout.n << " grad " << int(gd) << " value " << bad << " at "
                         << where[0] << (where.size() > 1 ? " and " + std::to_string(where[1]) : ""));
            Buffers fast = start.clone();
            const UpdateReport r_fast = cpu_update({fast.span(100)}, h, nullptr, nullptr, isa);
            EXPECT_EQ(report_text(r_fast), report_text(r_ref));
            EXPECT_EQ(first_difference(fast, ref), "");
            ++cases;
          }
        }
      }
  EXPECT_EQ(cases, static_cast<int>(2 * 3 * (17 + 3) * levels.size()));
}

// The random bits of lane j are those of element index_base + i + j modulo 2^32: bases just below
// 2^32 wrap inside a vector of 16.
TEST(CpuUpdateAvx512, StochasticRoundingKeepsEachElementsIndexAcrossThe32BitWrap) {
  AVX512_LEVELS_OR_SKIP(levels);
  for (const int64_t base : {int64_t{3}, (int64_t{1} << 32) - 9, (int64_t{1} << 32) - 1, (int64_t{1} << 33) + 7})
    for (const UpdateRule rule : {UpdateRule::kAdamW, UpdateRule::kSgd, UpdateRule::kLion}) {
      const Buffers start(1003, 5, Dtype::kBF16, Dtype::kBF16, 41);
      Buffers ref = start.clone();
      for (int64_t step = 1; step <= 2; ++step)
        ASSERT_TRUE(cpu_update({ref.span(base)}, hyper_for(rule, Rounding::kStochastic, step, kSeed), nullptr, nullptr,
                               CpuIsa::kScalar)
                        .ok());
      for (const CpuIsa isa : levels) {
        Buffers fast = start.clone();
        for (int64_t step = 1; step <= 2; ++step)
          ASSERT_TRUE(
              cpu_update({fast.span(base)}, hyper_for(rule, Rounding::kStochastic, step, kSeed), nullptr, nullptr, isa)
                  .ok());
        EXPECT_EQ(first_difference(fast, ref), "") << to_string(isa) << " index base " << base << " rule " << int(rule);
      }
    }
}

// Every sign, exponent and upper mantissa (all 65536 upper halves) with the lower halves that
// decide the rounding: zero, the smallest, just below, at and just above the tie, the largest.
// That covers NaNs whose payload lies in the dropped half only, subnormals, ties to even and odd,
// and values that round up into infinity. n = 458752 + 7 leaves a scalar tail.
TEST(CpuUpdateAvx512, Bf16ConversionOfEveryUpperHalfAndRoundingCaseMatchesTheScalarConversion) {
  AVX512_LEVELS_OR_SKIP(levels);
  IsaGuard restore;
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, 0x1234u};
  std::vector<uint32_t> bits;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (const uint32_t lo : lows) bits.push_back(hi << 16 | lo);
  for (const uint32_t extra :
       {0x7F800001u, 0xFF800001u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0x3F808000u, 0x3F818000u})
    bits.push_back(extra);
  std::vector<float> src(bits.size());
  std::memcpy(src.data(), bits.data(), bits.size() * sizeof(float));
  for (const CpuIsa isa : levels)
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{17}, static_cast<int64_t>(bits.size())}) {
      std::vector<uint16_t> scalar(n), fast(n);
      set_cpu_isa(CpuIsa::kScalar);
      cpu_to_bf16(src.data(), scalar.data(), n);
      set_cpu_isa(isa);
      cpu_to_bf16(src.data(), fast.data(), n);
      int64_t differ = 0, first = -1;
      for (int64_t i = 0; i < n; ++i)
        if (scalar[i] != fast[i]) {
          if (first < 0) first = i;
          ++differ;
        }
      EXPECT_EQ(differ, 0) << to_string(isa) << " n=" << n << ": first at " << first << ", input bits 0x" << std::hex
                           << (first >= 0 ? bits[first] : 0u) << ": scalar 0x" << (first >= 0 ? scalar[first] : 0)
                           << ", " << to_string(isa) << " 0x" << (first >= 0 ? fast[first] : 0);
    }
}

// The conversion's cases on their own, so a failure names the rule broken: NaN stays NaN (quieted),
// subnormals flush to signed zero, ties go to even, the largest finite values round up to infinity.
TEST(CpuUpdateAvx512, Bf16ConversionFollowsTheDocumentedRules) {
  AVX512_LEVELS_OR_SKIP(levels);
  IsaGuard restore;
  struct Want {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
  const Want wants[] = {{0x7F800001u, 0x7FC0u, "signalling NaN with a low payload is quieted, not made Inf"},
                        {0xFFC00001u, 0xFFC0u, "negative quiet NaN keeps its sign"},
                        {0x7F800000u, 0x7F80u, "+Inf"},
                        {0xFF800000u, 0xFF80u, "-Inf"},
                        {0x00000001u, 0x0000u, "smallest subnormal flushes to +0"},
                        {0x807FFFFFu, 0x8000u, "largest negative subnormal flushes to -0"},
                        {0x3F808000u, 0x3F80u, "tie below an even mantissa rounds down"},
                        {0x3F818000u, 0x3F82u, "tie below an odd mantissa rounds up"},
                        {0x3F808001u, 0x3F81u, "just above the tie rounds up"},
                        {0x7F7FFFFFu, 0x7F80u, "the largest float rounds up to Inf"},
                        {0x00800000u, 0x0080u, "the smallest normal stays"}};
  constexpr int kN = sizeof(wants) / sizeof(wants[0]);
  // Repeated so that both the 16-lane vectors and the scalar tail meet each case.
  std::vector<float> src(3 * kN);
  for (int i = 0; i < 3 * kN; ++i) std::memcpy(&src[i], &wants[i % kN].in, 4);
  for (const CpuIsa isa : levels) {
    set_cpu_isa(isa);
    std::vector<uint16_t> out(src.size());
    cpu_to_bf16(src.data(), out.data(), static_cast<int64_t>(src.size()));
    for (int i = 0; i < 3 * kN; ++i)
      EXPECT_EQ(out[i], wants[i % kN].out) << to_string(isa) << " element " << i << ": " << wants[i % kN].what;
  }
}

TEST(CpuUpdateAvx512, RollbackRestoresTheStateAndRewritesTheBf16Copy) {
  AVX512_LEVELS_OR_SKIP(levels);
  IsaGuard restore;
  for (const CpuIsa isa : levels) {
    set_cpu_isa(isa);  // cpu_rollback's bf16 copy uses the active level
    for (const int64_t offset : {0, 5}) {
      Buffers b(70001, offset, Dtype::kBF16, Dtype::kBF16, 61);
      cpu_to_bf16(b.master.data_ptr<float>(), reinterpret_cast<uint16_t*>(b.out.data_ptr()), b.master.numel());
      const Buffers before = b.clone();
      auto um = torch::empty_like(b.master), mm = torch::empty_like(b.m), vv = torch::empty_like(b.v);
      const std::vector<UndoLog> undo = {{um.data_ptr<float>() + offset,
                                          static_cast<char*>(mm.data_ptr()) + offset * mm.element_size(),
                                          static_cast<char*>(vv.data_ptr()) + offset * vv.element_size()}};
      b.set_grad(66000, std::numeric_limits<float>::quiet_NaN());
      const UpdateReport r =
          cpu_update({b.span()}, hyper_for(UpdateRule::kAdamW, Rounding::kStochastic, 3, kSeed), &undo, nullptr, isa);
      EXPECT_EQ(r.nonfinite, 1);
      EXPECT_EQ(r.skipped_tiles, 1);
      EXPECT_NE(first_difference(b, before), "") << to_string(isa) << " offset " << offset << ": nothing was updated";
      cpu_rollback({b.span()}, undo);
      EXPECT_EQ(first_difference(b, before), "") << to_string(isa) << " offset " << offset;
    }
  }
}

}  // namespace
}  // namespace tandem
