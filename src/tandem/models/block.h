#pragma once
// The unit of the engine: a Block owns its parameters and maps one activation to the next.
// A model is a sequence of Blocks: embedding, decoder layers 0..L-1, head (ARCHITECTURE.md).

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "tandem/models/block_sequence.h"

namespace tandem {

/// One unit of offload, streaming, placement and checkpoint sharding.
class Block : public torch::nn::Module {
 public:
  Block(BlockKind kind, std::string name, std::string hf_prefix)
      : kind_(kind), name_(std::move(name)), hf_prefix_(std::move(hf_prefix)) {}

  /// Embedding: (B, T) int64 tokens -> (B, T, C). Layer: (B, T, C) -> (B, T, C). Head: (B, T, C) -> (B, T, V_pad).
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;

  /// The parameters this Block owns, under their HF names (a tied head owns none of the embedding).
  virtual std::vector<NamedTensor> hf_parameters() {
    std::vector<NamedTensor> out;
    for (const auto& item : named_parameters(/*recurse=*/true)) out.emplace_back(hf_prefix_ + item.key(), item.value());
    return out;
  }

  /// The shape `param` (one of hf_parameters(), named `name`) has in an HF checkpoint: its own, less
  /// the padding (vocabulary rows, feed-forward units: Note [Zero padding keeps the function]).
  virtual std::vector<int64_t> hf_shape(const std::string& name, const torch::Tensor& param) const {
    (void)name;
    return param.sizes().vec();
  }

  BlockKind kind() const { return kind_; }
  /// Short display name: "embed", "layer.3", "head".
  const std::string& name() const { return name_; }

 protected:
  BlockKind kind_;
  std::string name_;
  std::string hf_prefix_;
};

}  // namespace tandem
