// The host arena of activation offload (Note [Activation host arena]): the first step outside the
// slab, later steps cut from one slab of the step's size and started over at its front, a step that
// outgrows the slab, tensors that never all die, layouts and values kept.

#include "tandem/models/host_arena.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace tandem {
namespace {

HostArena pageable_arena(int* slabs = nullptr) {
  return HostArena(
      [slabs](int64_t bytes) {
        if (slabs != nullptr) ++*slabs;
        return at::empty({bytes}, at::kByte);
      },
      /*pinned=*/false);
}

at::Tensor take(HostArena& a, std::vector<int64_t> sizes) {
  return a.take(sizes, c10::contiguous_strides(sizes), at::kFloat, std::nullopt);
}

uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

TEST(HostArena, TheSecondStepIsCutFromOneSlabOfTheFirstStepsSize) {
  int slabs = 0;
  HostArena a = pageable_arena(&slabs);
  std::vector<uintptr_t> first_addresses;
  for (int step = 0; step < 3; ++step) {
    std::vector<at::Tensor> saved;
    for (int i = 0; i < 4; ++i) saved.push_back(take(a, {256, 3 + i}));  // 3072 .. 6144 bytes each
    EXPECT_EQ(a.live(), 4);
    std::vector<uintptr_t> addresses;
    for (const auto& t : saved) addresses.push_back(address(t));
    if (step == 0) {
      EXPECT_EQ(a.capacity(), 0) << "no slab before a step has been seen";
      EXPECT_GT(a.fallback_bytes(), 0);
    } else {
      EXPECT_GT(a.capacity(), 0);
      for (size_t i = 1; i < saved.size(); ++i) EXPECT_GE(addresses[i], addresses[i - 1] + 256 * (3 + i - 1) * 4);
      if (step == 2) EXPECT_EQ(addresses, first_addresses) << "the third step starts over at the slab's front";
      first_addresses = addresses;
    }
    saved.clear();
    EXPECT_EQ(a.live(), 0);
  }
  EXPECT_EQ(slabs, 1);
  EXPECT_EQ(a.fallback_bytes(), 256 * (3 + 4 + 5 + 6) * 4) << "only the first step went outside the slab";
}

TEST(HostArena, AStepThatOutgrowsTheSlabMakesItLargerWhenTheNextStarts) {
  int slabs = 0;
  HostArena a = pageable_arena(&slabs);
  { const auto t = take(a, {1024}); }
  { const auto t = take(a, {1024}); }  // the slab of the first step's size
  const int64_t small = a.capacity();
  ASSERT_GT(small, 0);
  {
    const auto big = take(a, {small});  // 4 bytes an element: four times the slab
    EXPECT_EQ(a.capacity(), small) << "a slab is made only when a step starts";
  }
  { const auto t = take(a, {1024}); }
  EXPECT_GE(a.capacity(), 4 * small);
  EXPECT_EQ(slabs, 2);
}

TEST(HostArena, LiveTensorsAreNeverOverwrittenAndKeepTheirLayoutAndValues) {
  HostArena a = pageable_arena();
  { const auto t = take(a, {64, 64}); }
  const auto held = take(a, {64, 64});  // alive through the next "step": no start-over
  held.copy_(torch::full({64, 64}, 7.0));
  std::vector<at::Tensor> more;
  for (int i = 0; i < 3; ++i) {
    more.push_back(a.take({64, 32}, {1, 64}, at::kFloat, std::nullopt));  // a transposed layout
    EXPECT_EQ(more.back().strides(), (std::vector<int64_t>{1, 64}));
    more.back().copy_(torch::full({64, 32}, float(i)));
  }
  more.clear();
  const auto later = take(a, {64, 64});
  later.fill_(-1);
  EXPECT_TRUE(torch::equal(held, torch::full({64, 64}, 7.0))) << "a live tensor's memory was handed out again";
  EXPECT_NE(address(later), address(held));
}

TEST(HostArena, TensorsTakenAfterTheSlabIsFullGoOutsideIt) {
  HostArena a = pageable_arena();
  { const auto t = take(a, {1000}); }
  const auto first = take(a, {1000});  // fills the slab (rounded to 2 MiB: 4000 bytes do not)
  const int64_t before = a.fallback_bytes();
  for (int i = 0; i < 100; ++i) {
    const auto t = take(a, {1 << 16});  // 256 KiB each, seven fit beside `first`
    t.fill_(float(i));
    EXPECT_EQ(t[7].item<float>(), float(i));
  }
  EXPECT_GT(a.fallback_bytes(), before) << "past the slab, tensors come from the fallback allocator";
  EXPECT_EQ(a.live(), 1);
}

}  // namespace
}  // namespace tandem
