#pragma once
// The engine's boundary: what the offload engine, the parameter store and the gradient reducer
// need from a model, whoever defined it (Note [Block sequence]).
//
// Note [Block sequence]
// A model reaches the engine as a sequence of Blocks in forward order, each a group of named
// parameters with a role (embedding, layer, head). The engine needs four things of it:
//   - the Blocks' count, names and kinds (only a layer may run on the CPU, Note [Block placement]);
//   - each Block's parameters under their checkpoint names, every trainable tensor in exactly one
//     Block (a tied weight once, in the first Block that uses it); the engine rebinds them as views
//     of its flat buffers (Note [ParamStore layout]) and hooks their gradient accumulation;
//   - a call before each Block's forward (set_before_block), where the engine waits for that
//     Block's weights of this step;
//   - the Blocks to run on the host (set_host_blocks), their input and output crossing devices
//     inside autograd.
// tandem's presets (Model, C++ modules) implement it directly; a user's Python nn.Module implements
// it through the Python package (python/: its repeated layers found or named, the rest split into
// the edge Blocks, the before-Block call made by a forward pre-hook).

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

/// A parameter with its checkpoint (HF) name.
using NamedTensor = std::pair<std::string, torch::Tensor>;

/// The role of a Block in the sequence.
enum class BlockKind { kEmbedding, kLayer, kHead };

class BlockSequence {
 public:
  virtual ~BlockSequence() = default;

  virtual size_t block_count() const = 0;
  /// Short display name: "embed", "layer.3", "head".
  virtual std::string block_name(size_t i) const = 0;
  virtual BlockKind block_kind(size_t i) const = 0;
  /// Block i's parameters under their checkpoint names, fp32 (the engine's masters start from them).
  virtual std::vector<NamedTensor> block_parameters(size_t i) = 0;
  /// Called with the Block's index before each Block's forward; empty = none.
  virtual void set_before_block(std::function<void(size_t)> fn) = 0;
  /// Blocks flagged run on the host from the next forward on (Note [Block placement]); empty = none.
  virtual void set_host_blocks(std::vector<bool> host) = 0;
};

}  // namespace tandem
