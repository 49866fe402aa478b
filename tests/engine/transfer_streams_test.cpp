// The offload engine's transfer streams on a GPU: D2H and H2D streams apart from the compute
// stream, a copy down ordered behind the compute stream by G_i and completed by D_i, and
// synchronize() leaving every stream idle. Skipped without a CUDA device.

#include "tandem/engine/transfer_streams.h"

#include <c10/core/StreamGuard.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace tandem {
namespace {

TEST(TransferStreams, EventsOrderACopyDownBehindTheComputeStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device dev(torch::kCUDA, 0);
  TransferStreams s(dev, 3);
  EXPECT_EQ(s.grad_ready.size(), 3u);
  EXPECT_EQ(s.landed.size(), 3u);
  EXPECT_EQ(s.uploaded.size(), 3u);
  EXPECT_NE(s.d2h, s.compute());
  EXPECT_NE(s.h2d, s.compute());
  EXPECT_NE(s.d2h, s.h2d);
  // (2^24) fp32 on the compute stream: many small kernels, then the value the copy must see.
  auto x = torch::zeros({int64_t{1} << 24}, torch::TensorOptions().device(dev));
  for (int k = 0; k < 50; ++k) x.add_(1.0);
  x.fill_(3.0);
  s.grad_ready[1]->record(s.compute());
  s.d2h.wait(*s.grad_ready[1]);
  auto h = torch::empty(x.sizes(), torch::TensorOptions().pinned_memory(true));
  {
    const c10::StreamGuard guard(s.d2h);
    h.copy_(x, /*non_blocking=*/true);
  }
  s.landed[1]->record(s.d2h);
  s.landed[1]->synchronize();
  EXPECT_EQ(h.eq(3.0).all().item<bool>(), true) << "the copy down ran before the compute stream's work";
  EXPECT_GE(s.grad_ready[1]->elapsedTime(*s.landed[1]), 0.0);
  // Weights up on the H2D stream; synchronize() waits for every stream.
  h.fill_(5.0);
  {
    const c10::StreamGuard guard(s.h2d);
    x.copy_(h, /*non_blocking=*/true);
  }
  s.uploaded[1]->record(s.h2d);
  s.synchronize();
  EXPECT_TRUE(s.uploaded[1]->query());
  EXPECT_TRUE(s.impl.queryStream(s.h2d));
  EXPECT_TRUE(s.impl.queryStream(s.d2h));
  EXPECT_EQ(x.eq(5.0).all().item<bool>(), true);
}

}  // namespace
}  // namespace tandem
