// Note [Pinned host buffers]: host buffers start zero-filled, at their size, and go back when the
// last tensor viewing them is freed. On a machine with a GPU the same buffers are also page-locked.
#include "tandem/memory/pinned.h"

#include <gtest/gtest.h>

#include "tandem/core/device.h"

namespace tandem {
namespace {

// Sizes below a page, between a page and a huge page, and above a huge page, none a multiple of
// either.
const int64_t kSizes[] = {1, 7, 1000003, (int64_t{5} << 20) + 17};

TEST(PinnedHostBuffer, StartsZeroFilledAtItsSize) {
  for (const auto memory : {HostMemory::kPageable, HostMemory::kPinned})
    for (const int64_t n : kSizes)
      for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
        const auto t = host_tensor(n, dtype, memory);
        ASSERT_EQ(t.numel(), n);
        ASSERT_EQ(t.scalar_type(), dtype);
        ASSERT_TRUE(t.device().is_cpu());
        EXPECT_EQ(t.count_nonzero().item<int64_t>(), 0) << n << " elements";
        t.fill_(3);  // every element is writable
        EXPECT_TRUE(t.eq(3).all().item<bool>()) << n << " elements";
      }
}

TEST(PinnedHostBuffer, IsReturnedWhenTheLastViewGoes) {
  // 256 MiB mapped and freed 16 times: a leak would add 4 GiB of resident memory.
  const int64_t rss_before = host_peak_rss_bytes();
  for (int i = 0; i < 16; ++i) {
    auto t = host_tensor(int64_t{64} << 20, torch::kFloat32, HostMemory::kPageable);
    auto view = t.narrow(0, 5, 10);
    t = torch::Tensor();
    view.fill_(1);  // the view keeps the mapping alive
  }
  EXPECT_LT(host_peak_rss_bytes() - rss_before, int64_t{1} << 30);
}

TEST(PinnedHostBuffer, IsPageLockedWhereAGpuIs) {
  if (accelerator() == nullptr || accelerator()->device_count() == 0) GTEST_SKIP() << "no GPU";
  auto host = host_tensor((int64_t{3} << 20) + 5, torch::kFloat32, HostMemory::kPinned);
  EXPECT_TRUE(host.is_pinned());
  host.copy_(torch::arange(host.numel(), torch::kFloat32));
  const auto dev = host.to(torch::kCUDA, /*non_blocking=*/true);
  auto back = host_tensor(host.numel(), torch::kFloat32, HostMemory::kPinned);
  back.copy_(dev, /*non_blocking=*/true);
  accelerator()->synchronize(0);
  EXPECT_TRUE(torch::equal(back, host));
}

}  // namespace
}  // namespace tandem
