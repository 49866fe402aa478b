#pragma once
// A user's nn.Module as a BlockSequence (Note [Block sequence]): the Blocks the Python package
// found or was given, each a group of the module's own parameters, and the calls its forward
// hooks make into the engine.

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "tandem/models/block_sequence.h"

namespace tandem {

/// One Block of a Python model: its display name, its role and its parameters (the module's
/// nn.Parameter objects themselves, under their checkpoint names).
struct BlockGroup {
  std::string name;
  BlockKind kind = BlockKind::kLayer;
  std::vector<NamedTensor> params;
};

class ModuleBlocks : public BlockSequence {
 public:
  /// UserError when a tensor is in two Blocks or twice in one, two parameters share a name, a
  /// Block is empty, or a parameter is not floating point. Parameters in another float dtype are
  /// widened to fp32 in place (the engine's masters start from them).
  explicit ModuleBlocks(std::vector<BlockGroup> groups);

  size_t block_count() const override { return groups_.size(); }
  std::string block_name(size_t i) const override { return groups_.at(i).name; }
  BlockKind block_kind(size_t i) const override { return groups_.at(i).kind; }
  std::vector<NamedTensor> block_parameters(size_t i) override { return groups_.at(i).params; }
  void set_before_block(std::function<void(size_t)> fn) override { before_ = std::move(fn); }
  void set_host_blocks(std::vector<bool> host) override { host_ = std::move(host); }

  /// Called by Block i's forward pre-hook.
  void before_block(size_t i) {
    if (before_) before_(i);
  }
  /// Whether Block i runs on the host (its forward hooks move its input and output across).
  bool host_block(size_t i) const { return i < host_.size() && host_[i]; }
  /// Every parameter once, in Block order.
  std::vector<NamedTensor> all_parameters() const;
  /// Elements of Block i's parameters, and of all of them.
  int64_t block_numel(size_t i) const;
  int64_t numel() const;

 private:
  std::vector<BlockGroup> groups_;
  std::function<void(size_t)> before_;
  std::vector<bool> host_;
};

}  // namespace tandem
