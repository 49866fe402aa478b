#pragma once
// A pipeline stage's view of a preset: the BlockSequence (Note [Block sequence]) of Blocks
// [first, end) of a Model, so the offload engine, the gradient reducer and the optimizer see only
// the Blocks this stage trains (Note [Pipeline parallel]). Indices are the stage's own (0 = its
// first Block); the Model's are first + i.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "tandem/models/model.h"

namespace tandem {

class StageBlocks : public BlockSequence {
 public:
  StageBlocks(Model& model, size_t first, size_t end);

  size_t first() const { return first_; }
  size_t end() const { return end_; }
  Model& model() { return model_; }
  /// Every trainable tensor of the stage once, under its HF name (as Model::hf_parameters).
  std::vector<NamedTensor> hf_parameters();

  size_t block_count() const override { return end_ - first_; }
  std::string block_name(size_t i) const override { return model_.block_name(first_ + i); }
  BlockKind block_kind(size_t i) const override { return model_.block_kind(first_ + i); }
  std::vector<NamedTensor> block_parameters(size_t i) override { return model_.block_parameters(first_ + i); }
  void set_before_block(std::function<void(size_t)> fn) override;
  void set_host_blocks(std::vector<bool> host) override;

 private:
  Model& model_;
  size_t first_, end_;
};

}  // namespace tandem
