// A Block's host master (engine/host_masters.h, Note [bf16 master]): one fp32 or bf16 buffer, or
// two for Kahan; values written and read back to bf16's 8 bits or, with the compensation, about 16,
// and a pair read out in fp32 and set again the same bits.
#include "tandem/engine/host_masters.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "tandem/engine/param_store.h"

namespace tandem {
namespace {

constexpr int64_t kSlice = 5003;

BlockStore block() {
  BlockStore b;
  b.name = "layer.0";
  b.numel = b.shard_numel = b.padded_numel = kSlice;
  return b;
}

TEST(MasterKinds, OneBufferInItsDtypeOrTwoBf16ForKahan) {
  const std::pair<MasterKind, std::vector<torch::ScalarType>> cases[] = {
      {MasterKind::kFp32, {torch::kFloat32}},
      {MasterKind::kBf16Stochastic, {torch::kBFloat16}},
      {MasterKind::kBf16Kahan, {torch::kBFloat16, torch::kBFloat16}},
  };
  for (const auto& [kind, want] : cases) {
    std::vector<torch::ScalarType> got;
    BlockStore b = block();
    allocate_host_master(b, kind, [&](int64_t n, torch::ScalarType t) {
      EXPECT_EQ(n, kSlice);
      got.push_back(t);
      return torch::zeros({n}, t);
    });
    EXPECT_EQ(got, want);
    EXPECT_EQ(bf16_master(b), kind != MasterKind::kFp32);
    EXPECT_EQ(b.master_comp.defined(), kind == MasterKind::kBf16Kahan);
  }
}

TEST(MasterKinds, ValuesComeBackExactFromFp32ToBf16sBitsOrAboutSixteenWithTheCompensation) {
  torch::manual_seed(3);
  const auto x = torch::randn({kSlice}) * torch::pow(10.0, torch::randint(-3, 2, {kSlice}).to(torch::kFloat32));
  const auto alloc = [](int64_t n, torch::ScalarType t) { return torch::zeros({n}, t); };
  const std::pair<MasterKind, double> cases[] = {
      {MasterKind::kFp32, 0.0}, {MasterKind::kBf16Stochastic, 1.0 / 256}, {MasterKind::kBf16Kahan, 1.0 / 32768}};
  for (const auto& [kind, rel] : cases) {
    BlockStore b = block();
    allocate_host_master(b, kind, alloc);
    set_master(b, 0, x);
    const auto back = master_f32(b);
    EXPECT_LE(((back - x).abs() / x.abs()).max().item<double>(), rel) << static_cast<int>(kind);
    if (kind == MasterKind::kBf16Kahan) {  // and not merely bf16's precision
      EXPECT_GT(((b.master.to(torch::kFloat32) - x).abs() / x.abs()).max().item<double>(), 1.0 / 1024);
    }
    // A part of the slice, read and written alone.
    set_master(b, 100, torch::full({7}, 0.5));
    EXPECT_TRUE(torch::equal(master_f32(b, 100, 7), torch::full({7}, 0.5)));
    EXPECT_TRUE(torch::equal(master_f32(b, 99, 1), back.narrow(0, 99, 1)));
    EXPECT_TRUE(torch::equal(master_f32(b, 107, 1), back.narrow(0, 107, 1)));
    // A value read back is written again to the same bits (a move to the device and back).
    BlockStore again = block();
    allocate_host_master(again, kind, alloc);
    set_master(again, 0, master_f32(b));
    EXPECT_TRUE(torch::equal(again.master, b.master));
    if (kind == MasterKind::kBf16Kahan) {
      EXPECT_TRUE(torch::equal(again.master_comp, b.master_comp));
    }
  }
}

}  // namespace
}  // namespace tandem
