#pragma once
// Checkpoints of a pipeline-parallel run (Note [Pipeline checkpoints]): the stages' Blocks gathered
// on rank 0, which writes the same whole files as one process.
//
// Note [Pipeline checkpoints]
// Every rank builds the whole model and trains only its stage's Blocks. Before rank 0 writes a
// checkpoint, the first replica of every other stage sends rank 0 its Blocks' weights (the fp32
// masters, with the offload engine) and its optimizer's state, names first through the store,
// tensors through Gloo; rank 0 copies the weights into its own copies of those Blocks (which it
// never trains) and adds the states to its optimizer's. So a checkpoint is per Block and HF-named
// whatever the pipeline: a resume reads the whole files on every rank, each stage takes its Blocks'
// weights and its optimizer's states by name, and the run goes on at any stage count, with data
// parallel instead, or in one process.

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tandem/optim/optimizer.h"
#include "tandem/parallel/pipeline_grid.h"

namespace tandem {

class Comm;
class Model;
class StageBlocks;

/// A stage's optimizer, with (on rank 0) the states the other stages sent for a checkpoint.
class GatheredOptimizer : public Optimizer {
 public:
  explicit GatheredOptimizer(Optimizer& stage) : stage_(stage) {}
  void step(double lr, const std::optional<torch::Tensor>& found_inf) override { stage_.step(lr, found_inf); }
  void zero_grad() override { stage_.zero_grad(); }
  /// The stage's states, then those gathered.
  std::vector<NamedTensor> state() override;
  /// Into the stage's optimizer: the other stages' states in the file are theirs.
  void load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                  const std::string& source) override;
  std::vector<NamedTensor>& gathered() { return gathered_; }

 private:
  Optimizer& stage_;
  std::vector<NamedTensor> gathered_;
};

/// Every rank at once, with this stage's weights readable (the masters bound): stage leaders send
/// their Blocks' weights and `optimizer`'s stage states to rank 0, which copies the weights into
/// `model` and keeps the states in `optimizer.gathered()`. `round` numbers the gathers (the same
/// on every rank).
void gather_pipeline_state(Comm& comm, const PipelineGrid& grid, StageBlocks& stage, GatheredOptimizer& optimizer,
                           Model& model, int64_t round);

}  // namespace tandem
