#pragma once
// Activations and their gradients between neighbouring pipeline stages (Note [Pipeline parallel],
// Note [Stage links]): point to point over c10d (NCCL between GPUs; Gloo through host memory
// otherwise, with NCCL's semantics: Note [Strict point to point]). Each tensor is preceded by a
// small header (dtype and shape), so a stage needs to know nothing of its neighbour's Blocks,
// autocast or micro-batch size.

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <deque>
#include <optional>

#include "tandem/parallel/pipeline_grid.h"

namespace tandem {

class Comm;

class StageLink {
 public:
  /// Over `comm`'s stage links (Comm::Link: activations down, gradients up) between the neighbours
  /// of `grid`; tensors arrive on `device`. A receive marks this rank's wait (Comm::Waiting).
  StageLink(Comm& comm, const PipelineGrid& grid, c10::Device device);
  ~StageLink();
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  /// Starts sending micro-batch `micro`'s output to the next stage (completes by wait_sends()).
  /// At most 6 dimensions.
  void send_activation(const torch::Tensor& y, int64_t micro);
  /// Micro-batch `micro`'s input from the previous stage, on the device (blocks until its header
  /// has arrived; the compute stream waits for the rest).
  torch::Tensor recv_activation(int64_t micro);
  /// Starts sending the gradient of micro-batch `micro`'s input back to the previous stage.
  void send_gradient(const torch::Tensor& g, int64_t micro);
  /// The gradient of micro-batch `micro`'s output from the next stage.
  torch::Tensor recv_gradient(int64_t micro);
  /// Waits for every send started (the end of a step).
  void wait_sends();
  /// Seconds spent blocked in a receive since the last call (the stage's wait for its neighbours).
  double take_wait_s();

 private:
  void send(c10d::Backend& link, const torch::Tensor& x, int rank, int64_t micro);
  torch::Tensor recv(c10d::Backend& link, int rank, int64_t micro, const char* what);

  Comm& comm_;
  c10d::Backend& down_;
  c10d::Backend& up_;
  PipelineGrid grid_;
  c10::Device device_;
  bool host_transport_;              // not NCCL: tensors travel from and to host memory
  std::optional<c10::Stream> side_;  // NCCL: receives are issued and awaited here, not on the compute stream
  std::deque<c10::intrusive_ptr<c10d::Work>> sends_;
  double wait_s_ = 0;
};

}  // namespace tandem
