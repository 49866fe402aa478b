#pragma once
// Activations and their gradients between neighbouring pipeline stages (Note [Pipeline parallel],
// Note [Stage links]): point to point over c10d (NCCL between GPUs; Gloo through host memory
// otherwise, with NCCL's semantics: Note [Strict point to point]). A step's first activation is
// preceded by a small header (dtype and shape), so a stage needs to know nothing of its neighbour's
// Blocks, autocast or micro-batch size; the step's other activations and every gradient have that
// shape, so their receives are queued without waiting for anything.

#include <c10/core/Event.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <deque>
#include <string>
#include <vector>

#include "tandem/parallel/pipeline_grid.h"

namespace tandem {

class Comm;

class StageLink {
 public:
  /// Over `comm`'s stage links (Comm::Link: activations down, gradients up) between the neighbours
  /// of `grid`; tensors arrive on `device`. Where the host waits (a step's first activation, every
  /// receive over a host transport, wait_receives()), it marks this rank's wait (Comm::Waiting).
  StageLink(Comm& comm, const PipelineGrid& grid, c10::Device device);
  ~StageLink();
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  /// Starts sending micro-batch `micro`'s output to the next stage (completes by wait_sends()).
  /// Micro-batch 0 starts a step (or an evaluation): its output may have any dtype and at most 6
  /// dimensions; every later one of the step must have the same.
  void send_activation(const torch::Tensor& y, int64_t micro);
  /// Micro-batch `micro`'s input from the previous stage, on the device. Micro-batch 0's waits on
  /// the host for its header; on a GPU the others are queued on the compute stream, which waits for
  /// them (the host does not).
  torch::Tensor recv_activation(int64_t micro);
  /// Starts sending the gradient of micro-batch `micro`'s input back to the previous stage.
  void send_gradient(const torch::Tensor& g, int64_t micro);
  /// The gradient of micro-batch `micro`'s output from the next stage (the output's dtype and
  /// shape), queued as recv_activation queues its later micro-batches.
  torch::Tensor recv_gradient(int64_t micro);
  /// Waits on the host until every receive queued on the compute stream has arrived (the end of a
  /// step's passes), each under a Comm::Waiting naming it, so a neighbour that never sends is named
  /// (Note [Stalled ranks]).
  void wait_receives();
  /// Waits for every send started (the end of a step).
  void wait_sends();
  /// Seconds spent blocked in a receive since the last call (the stage's wait for its neighbours).
  double take_wait_s();

 private:
  struct Shape {
    std::vector<int64_t> sizes;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
  };
  void send(c10d::Backend& link, const torch::Tensor& x, int rank, int64_t micro, bool with_header);
  Shape recv_header(int rank, int64_t micro);
  torch::Tensor recv(c10d::Backend& link, int rank, int64_t micro, const Shape& shape, const char* what);

  Comm& comm_;
  c10d::Backend& down_;
  c10d::Backend& up_;
  PipelineGrid grid_;
  c10::Device device_;
  bool host_transport_;  // not NCCL: tensors travel from and to host memory
  Shape sent_;           // the step's activations sent (micro-batch 0's): the gradients coming back
  Shape received_;       // the step's activations received (micro-batch 0's header)
  struct Queued {
    c10::Event arrived;  // on the compute stream, behind the receive
    std::string what;    // "micro-batch 3's gradient from rank 1 (stage 1) over the stage link"
  };
  std::deque<c10::intrusive_ptr<c10d::Work>> sends_;
  std::deque<Queued> receives_;  // NCCL: queued on the compute stream, not yet seen to arrive
  double wait_s_ = 0;
};

}  // namespace tandem
