// The persistent decode step's planner and schedule (Note [Persistent decode step]), on the CPU: the
// plans of a 1B and a 7B shape on an H100's shared memory fit it and keep each slot one group's, every
// unit of every matrix belongs to exactly one block and one stage, the q/k/v units cover each row of
// the projection once, and shapes the kernel does not take are named.

#include "tandem/kernels/decode_step_plan.h"

#include <gtest/gtest.h>

#include <set>

namespace tandem::detail {
namespace {

constexpr int kSms = 132;
constexpr int64_t kShared = 232448;  // an H100's or H200's opt-in limit a block

DecodeStepDims llama_1b(int64_t rows) {  // the 0.99 B folder of gpu-check's serve part
  DecodeStepDims d;
  d.n_layer = 22, d.rows = rows, d.C = 2048, d.H = 32, d.KV = 4, d.hd = 64, d.rotary = 64, d.F = 5632, d.V = 32000;
  d.page_tokens = 16;
  return d;
}

DecodeStepDims llama_7b(int64_t rows) {
  DecodeStepDims d;
  d.n_layer = 32, d.rows = rows, d.C = 4096, d.H = 32, d.KV = 32, d.hd = 128, d.rotary = 128, d.F = 11008;
  d.V = 32000, d.page_tokens = 16;
  return d;
}

constexpr StepMatrix kAll[] = {StepMatrix::kQkv, StepMatrix::kO, StepMatrix::kGateUp, StepMatrix::kDown,
                               StepMatrix::kHead};

TEST(DecodeStepPlan, PlansFitTheSharedMemoryAndKeepEachSlotOneGroups) {
  for (int64_t rows = 1; rows <= 4; ++rows)
    for (const auto& d : {llama_1b(rows), llama_7b(rows)}) {
      DecodeStepPlan p;
      ASSERT_EQ(plan_decode_step(d, kSms, kShared, &p), "") << "C " << d.C << ", rows " << rows;
      EXPECT_EQ(p.blocks, kSms);
      EXPECT_LE(p.smem_bytes, kShared);
      EXPECT_EQ(p.slots % kDecodeStepGroups, 0);
      EXPECT_LE(p.slots, kDecodeStepMaxSlots);
      EXPECT_GE(p.x_bytes, rows * d.F * d.elem_bytes);  // the widest rows a product reads
      EXPECT_EQ(p.slot_bytes % 128, 0);
      for (const StepMatrix m : kAll) EXPECT_GE(units_per_stage(d, m, p.slot_bytes), 1);
      // The ring takes what the rows leave: at least 100 KiB in flight a block.
      EXPECT_GE(p.slots * p.slot_bytes, 100 * 1024) << "C " << d.C << ", rows " << rows;
    }
}

TEST(DecodeStepPlan, EveryUnitIsOneBlocksInOneStage) {
  const auto d = llama_1b(1);
  DecodeStepPlan p;
  ASSERT_EQ(plan_decode_step(d, kSms, kShared, &p), "");
  for (const StepMatrix m : kAll) {
    const int64_t units = matrix_units(d, m).units;
    int64_t next = 0, largest = 0, smallest = units;
    for (int b = 0; b < p.blocks; ++b) {
      const BlockUnits u = block_units(d, p, m, b);
      EXPECT_EQ(u.begin, next) << "matrix " << static_cast<int>(m) << ", block " << b;
      EXPECT_GE(u.stages * u.per_stage, u.end - u.begin);
      EXPECT_LT((u.stages - 1) * u.per_stage, std::max<int64_t>(1, u.end - u.begin));
      largest = std::max(largest, u.end - u.begin), smallest = std::min(smallest, u.end - u.begin);
      next = u.end;
    }
    EXPECT_EQ(next, units);
    EXPECT_LE(largest - smallest, 1);  // shares within one unit of each other
  }
}

TEST(DecodeStepPlan, TheQkvUnitsCoverEachRowOnce) {
  for (const int64_t rotary : {int64_t{64}, int64_t{32}, int64_t{0}}) {
    const QkvShape s{8, 2, 64, rotary};
    std::multiset<int64_t> rows;
    for (int64_t i = 0; i < qkv_units(s); ++i) {
      const QkvUnit u = qkv_unit(s, i);
      rows.insert(u.row(s));
      if (u.partner >= 0) rows.insert(u.partner_row(s));
      if (u.rotate) EXPECT_EQ(u.partner, u.d + rotary / 2);
    }
    const int64_t all = (s.H + 2 * s.KV) * s.hd;
    ASSERT_EQ(static_cast<int64_t>(rows.size()), all) << "rotary " << rotary;
    for (int64_t r = 0; r < all; ++r) EXPECT_EQ(rows.count(r), 1u) << "row " << r << ", rotary " << rotary;
  }
}

TEST(DecodeStepPlan, ShapesItDoesNotTakeAreNamed) {
  const auto refusal = [](DecodeStepDims d, int64_t shared = kShared) {
    DecodeStepPlan p;
    return plan_decode_step(d, kSms, shared, &p);
  };
  auto d = llama_1b(5);
  EXPECT_NE(refusal(d).find("5 rows"), std::string::npos);
  d = llama_1b(1), d.hd = 256, d.H = 8, d.rotary = 256;
  EXPECT_NE(refusal(d).find("heads of 256"), std::string::npos);
  d = llama_1b(1), d.elem_bytes = 4;
  EXPECT_NE(refusal(d).find("4-byte"), std::string::npos);
  d = llama_1b(1), d.KV = 2;  // 16 query heads a key/value head
  EXPECT_NE(refusal(d).find("32 query heads over 2"), std::string::npos);
  d = llama_1b(1), d.C = 16384;
  EXPECT_NE(refusal(d).find("width of 16384"), std::string::npos);
  d = llama_1b(1), d.F = 5630;
  EXPECT_NE(refusal(d).find("5630"), std::string::npos);
  EXPECT_NE(refusal(llama_1b(1), 48 * 1024).find("too few"), std::string::npos);
}

}  // namespace
}  // namespace tandem::detail
