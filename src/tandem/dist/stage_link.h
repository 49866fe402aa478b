#pragma once
// Activations and their gradients between neighbouring pipeline stages (Note [Pipeline parallel]):
// point to point over c10d (NCCL between GPUs, Gloo through host memory otherwise). Each tensor is
// preceded by a small header (dtype and shape), so a stage needs to know nothing of its
// neighbour's Blocks, autocast or micro-batch size.

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <vector>

namespace tandem {

class StageLink {
 public:
  /// Tensors arrive on `device`; `link` carries them (world ranks).
  StageLink(c10d::Backend& link, c10::Device device);
  ~StageLink();
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  /// Starts sending `x` to `rank` under `tag` (a tag per micro-batch and direction); completes by
  /// wait_sends(). At most 6 dimensions.
  void send(const torch::Tensor& x, int rank, int tag);
  /// The tensor `rank` sent under `tag`, on the device (blocks until it has arrived).
  torch::Tensor recv(int rank, int tag);
  /// Waits for every send started (the end of a step; their buffers are released).
  void wait_sends();
  /// Seconds spent blocked in recv() since the last call (the stage's wait for its neighbours).
  double take_wait_s();

 private:
  c10d::Backend& link_;
  c10::Device device_;
  bool host_transport_;  // Gloo: tensors travel from and to host memory
  std::vector<c10::intrusive_ptr<c10d::Work>> sends_;
  std::vector<torch::Tensor> in_flight_;  // kept alive until their sends complete
  double wait_s_ = 0;
};

}  // namespace tandem
