// Stage links (parallel/stage_link.h): tensors cross both ways intact in 1F1B's order, a step's
// micro-batches keep one shape, replicas keep to their own neighbours, out-of-order micro-batches
// fail naming the tags, and receive waits are measured. Ranks are threads on loopback Gloo.

#include "tandem/parallel/stage_link.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm_threads.h"
#include "tandem/core/error.h"
#include "tandem/parallel/comm.h"
#include "tandem/sched/pipeline_schedule.h"

namespace tandem::test {
namespace {

const c10::Device kCpu(c10::kCPU);

// Step `step`'s tensor for micro-batch `micro`, one kind a step (a step's micro-batches share their
// dtype and shape; Note [Stage links]): fp32, bf16, six dimensions (the most a header holds), 0-d
// fp64 and a non-contiguous view; `salt` tells activations from gradients.
torch::Tensor payload(int64_t step, int64_t micro, int64_t salt) {
  const double s = static_cast<double>(100 * step + 10 * micro + salt);
  switch (step % 5) {
    case 0:
      return torch::arange(30, torch::kFloat32).reshape({2, 3, 5}) + s;
    case 1:
      return (torch::arange(7, torch::kFloat32) / 8 + s).to(torch::kBFloat16);
    case 2:
      return torch::arange(12, torch::kInt64).reshape({1, 2, 1, 3, 2, 1}) * static_cast<int64_t>(s + 1);
    case 3:
      return torch::full({}, 2.5 + s, torch::kFloat64);
    default:
      return (torch::arange(12, torch::kFloat32).reshape({3, 4}) - s).t();
  }
}

void expect_same(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_EQ(got.device(), kCpu) << what;
  EXPECT_TRUE(torch::equal(got, want)) << what << ": got " << got << ", want " << want;
}

// Stage 0 sends F(i) and receives B(i); stage 1 receives F(i) and sends B(i), each in 1F1B's order,
// so stage 0 sends F1 before it receives B0 while stage 1 sends B0 before it receives F1: one group
// for both directions would have both ranks wait for each other (Note [Stage links]). Five steps, a
// dtype and shape each: only a step's first activation carries a header.
TEST(StageLink, TensorsCrossBothWaysWithTheirDtypeShapeAndValuesInOneFOneBsOrder) {
  constexpr int64_t m = 3;
  const auto errors = on_ranks(2, 2, port(10), [&](Comm& comm) {
    const PipelineGrid grid(comm.rank(), comm.world(), 2);
    StageLink link(comm, grid, kCpu);
    const auto passes = pipeline_passes(PipelineSchedule::k1F1B, grid.stage(), 2, m);
    ASSERT_EQ(passes.size(), static_cast<size_t>(2 * m));
    for (int64_t step = 0; step < 5; ++step) {
      for (const PipelinePass& pass : passes) {
        const std::string what = "step " + std::to_string(step) + " " +
                                 (pass.kind == PipelinePass::Kind::kForward ? "F" : "B") + std::to_string(pass.micro);
        const bool forward = pass.kind == PipelinePass::Kind::kForward;
        if (grid.first_stage() && forward)
          link.send_activation(payload(step, pass.micro, 1), pass.micro);
        else if (grid.first_stage())
          expect_same(link.recv_gradient(pass.micro), payload(step, pass.micro, 2), "stage 0 receiving " + what);
        else if (forward)
          expect_same(link.recv_activation(pass.micro), payload(step, pass.micro, 1), "stage 1 receiving " + what);
        else
          link.send_gradient(payload(step, pass.micro, 2), pass.micro);
      }
      link.wait_sends();
    }
  });
  expect_no_errors(errors);
}

// A step's later micro-batches and the gradients have micro-batch 0's dtype and shape: the receives
// are sized by it. Another is a bug in the caller, refused before anything is sent; the link goes on.
TEST(StageLink, ALaterMicroBatchOfAnotherShapeIsRefusedBeforeItIsSent) {
  const auto errors = on_ranks(2, 2, port(15), [&](Comm& comm) {
    const PipelineGrid grid(comm.rank(), comm.world(), 2);
    StageLink link(comm, grid, kCpu);
    if (grid.first_stage()) {
      link.send_activation(torch::ones({2, 3}), 0);
      EXPECT_THROW(link.send_activation(torch::ones({3, 3}), 1), InternalError);
      EXPECT_THROW(link.send_activation(torch::ones({2, 3}, torch::kFloat64), 1), InternalError);
      link.send_activation(torch::full({2, 3}, 5.0), 1);
      expect_same(link.recv_gradient(0), torch::full({2, 3}, -1.0), "gradient 0");
    } else {
      expect_same(link.recv_activation(0), torch::ones({2, 3}), "activation 0");
      expect_same(link.recv_activation(1), torch::full({2, 3}, 5.0), "activation 1 after the refused ones");
      EXPECT_THROW(link.send_gradient(torch::ones({2}), 0), InternalError);
      link.send_gradient(torch::full({2, 3}, -1.0), 0);
    }
    link.wait_sends();
  });
  expect_no_errors(errors);
}

// 2 stages x 2 replicas: rank r runs stage r / 2 of replica r % 2, and replica j's stages talk to
// each other alone.
TEST(StageLink, EachReplicaTalksToItsOwnNeighbour) {
  const auto errors = on_ranks(4, 2, port(11), [&](Comm& comm) {
    const PipelineGrid grid(comm.rank(), comm.world(), 2);
    StageLink link(comm, grid, kCpu);
    const double replica = grid.replica();
    for (int64_t micro = 0; micro < 2; ++micro) {
      const auto activation = torch::full({3}, 100.0 * replica + static_cast<double>(micro));
      if (grid.first_stage()) {
        link.send_activation(activation, micro);
        expect_same(link.recv_gradient(micro), -activation, "replica " + std::to_string(grid.replica()));
      } else {
        expect_same(link.recv_activation(micro), activation, "replica " + std::to_string(grid.replica()));
        link.send_gradient(-activation, micro);
      }
    }
    link.wait_sends();
  });
  expect_no_errors(errors);
}

// Both sides must go in micro-batch order: NCCL would hand micro-batch 1's tensor to a receive of
// micro-batch 2. A header goes under tag 2 * micro, a payload under 2 * micro + 1; only micro-batch
// 0 has a header.
TEST(StageLink, AMicroBatchReceivedOutOfOrderFailsNamingTheTags) {
  const auto errors = on_ranks(2, 2, port(12), [&](Comm& comm) {
    const PipelineGrid grid(comm.rank(), comm.world(), 2);
    StageLink link(comm, grid, kCpu);
    if (grid.first_stage()) {
      link.send_activation(torch::ones({4}), 0);
      link.send_activation(torch::ones({4}), 1);
      link.wait_sends();
    } else {
      link.recv_activation(0);
      link.recv_activation(2);
    }
  });
  EXPECT_NE(errors[1].find("from rank 0 to rank 1 was sent under tag 3 but received under tag 5"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[0], "") << "the sender's wait_sends() reports the failed send too";
}

// The wait is the time blocked in receives, handed out once; sends are not waits.
TEST(StageLink, TheTimeBlockedInReceivesIsTakenOnce) {
  double waited[2] = {-1, -1}, again[2] = {-1, -1};
  const auto errors = on_ranks(2, 2, port(13), [&](Comm& comm) {
    const PipelineGrid grid(comm.rank(), comm.world(), 2);
    StageLink link(comm, grid, kCpu);
    comm.barrier();
    if (grid.first_stage()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      link.send_activation(torch::ones({4}), 0);
      link.wait_sends();
    } else {
      expect_same(link.recv_activation(0), torch::ones({4}), "activation");
    }
    waited[comm.rank()] = link.take_wait_s();
    again[comm.rank()] = link.take_wait_s();
  });
  expect_no_errors(errors);
  EXPECT_EQ(waited[0], 0.0);
  EXPECT_GE(waited[1], 0.2) << "the receive cannot end before the send, 0.4 s after the barrier";
  EXPECT_EQ(again[0], 0.0);
  EXPECT_EQ(again[1], 0.0);
}

// Seven dimensions do not fit the header: a bug in the caller, refused before anything is sent.
TEST(StageLink, AnOutputOfMoreThanSixDimensionsIsRefusedBeforeItIsSent) {
  const auto errors = on_ranks(2, 2, port(14), [&](Comm& comm) {
    const PipelineGrid grid(comm.rank(), comm.world(), 2);
    StageLink link(comm, grid, kCpu);
    if (grid.first_stage()) {
      EXPECT_THROW(link.send_activation(torch::zeros({1, 1, 1, 1, 1, 1, 1}), 0), InternalError);
      link.send_activation(torch::full({2}, 7.0), 0);  // the link still works: nothing went out
      link.wait_sends();
    } else {
      expect_same(link.recv_activation(0), torch::full({2}, 7.0), "the activation after the refused one");
    }
  });
  expect_no_errors(errors);
}

}  // namespace
}  // namespace tandem::test
