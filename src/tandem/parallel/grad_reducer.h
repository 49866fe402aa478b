#pragma once
// Data parallel without the offload engine: each Block's gradients are summed over the ranks as
// soon as the last micro-batch's backward completes them, overlapped with the rest of backward
// (Note [Gradient reducer]).

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

#include "tandem/models/block_sequence.h"
#include "tandem/parallel/comm.h"

namespace tandem {

/// Hooks every parameter of a model; one collective per Block.
class GradReducer {
 public:
  GradReducer(BlockSequence& model, Comm& comm);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  /// Before each micro-batch's backward: on the last one, Blocks are reduced as they complete.
  void begin_micro(bool last);
  /// After the last backward: every Block reduced (those with parameters that got no gradient too)
  /// and the current stream made to wait for the reductions.
  void finish();

 private:
  void on_param_ready(size_t block);
  void reduce(size_t block);
  Comm& comm_;
  std::vector<std::vector<torch::Tensor>> params_;  // per Block
  std::vector<int64_t> remaining_;
  std::vector<bool> ready_;  // complete in the last micro-batch's backward
  int64_t next_ = -1;        // the next Block to reduce (those above it are): from the last Block down
  std::vector<c10::intrusive_ptr<c10d::Work>> work_;
  bool last_ = true;
};

}  // namespace tandem
