#pragma once
// A model as a sequence of Blocks, with HF-named state for checkpoints and pretrained weights.

#include <torch/torch.h>

#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tandem/models/activation_offload.h"
#include "tandem/models/block.h"
#include "tandem/models/block_sequence.h"
#include "tandem/models/spec.h"

namespace tandem {

/// The whole network: blocks_[0] embeds, blocks_[1..L] are decoder layers, blocks_.back() is the head.
/// A preset's BlockSequence (Note [Block sequence]).
class Model : public torch::nn::Module, public BlockSequence {
 public:
  /// Blocks outside [fill.first, fill.second) draw their initial weights' seeds but are left
  /// unfilled (Note [Stage build]); the default fills every Block.
  Model(const ModelSpec& spec, bool checkpointing,
        std::pair<size_t, size_t> fill = {0, std::numeric_limits<size_t>::max()});

  /// (B, T) int64 tokens -> (B, T, V_pad) logits. Decoder layers are recomputed in backward when
  /// activation checkpointing is on and gradients are being recorded.
  torch::Tensor forward(const torch::Tensor& tokens);
  /// Blocks [first, end) on `input` (tokens when first = 0, else the activation Block first - 1
  /// made): a pipeline stage's forward (Note [Pipeline parallel]).
  torch::Tensor forward_blocks(const torch::Tensor& input, size_t first, size_t end);

  /// Mean cross-entropy of logits (B, T, V_pad) against targets (B, T), over the real vocabulary
  /// only (padding columns never enter the softmax), computed in fp32, plus balance_loss() of every
  /// Block.
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const;
  /// The cross-entropy part of loss() alone.
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) const;
  /// The MoE layers' load-balance losses among Blocks [first, end) from the last forward, weighted
  /// by model.moe_aux_weight and divided by the model's MoE layer count, on `device`: summed over
  /// all pipeline stages it is the term loss() adds. Undefined when the range has no MoE layer.
  torch::Tensor balance_loss(size_t first, size_t end, const c10::Device& device) const;

  const std::vector<std::shared_ptr<Block>>& blocks() const { return blocks_; }
  const ModelSpec& spec() const { return spec_; }
  bool checkpointing() const { return checkpointing_; }

  /// Every trainable tensor once, under its HF name, with padded vocabulary rows.
  std::vector<NamedTensor> hf_parameters();

  /// HF-shaped views for export: vocabulary rows cut to spec().vocab_size.
  std::vector<NamedTensor> hf_state_dict();

  /// Copies HF-named tensors into the parameters (any float dtype, cast to the parameter's).
  /// `lookup(name)` returns the tensor or std::nullopt when absent. Throws UserError naming the
  /// first missing tensor or the first whose shape differs.
  void load_hf_state_dict(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                          const std::string& source);

  // BlockSequence.
  size_t block_count() const override { return blocks_.size(); }
  std::string block_name(size_t i) const override { return blocks_.at(i)->name(); }
  BlockKind block_kind(size_t i) const override { return blocks_.at(i)->kind(); }
  std::vector<NamedTensor> block_parameters(size_t i) override { return blocks_.at(i)->hf_parameters(); }
  /// Called with the Block's index before each Block's forward (the offload engine waits there for
  /// that Block's weights of this step); empty = none.
  void set_before_block(std::function<void(size_t)> fn) override { before_block_ = std::move(fn); }

  /// Note [Block placement]: Blocks flagged here run on the host. Their input crosses to the CPU
  /// and their output back to the input's device through pinned buffers, inside autograd (the
  /// gradient crosses back the same way); their parameters must already be host tensors (the
  /// offload engine binds them to the ParamStore's host copies). Empty = every Block where its
  /// parameters are.
  void set_host_blocks(std::vector<bool> host) override { host_blocks_ = std::move(host); }

  /// Note [Activation offload]: the decoder layers flagged here (by Block index) send what autograd
  /// saves in their forward to pinned host memory through `offload` and are never recomputed;
  /// empty = none. Makes tandem's autograd engine the default (use_tandem_autograd_engine); refused in Python.
  void set_activation_offload(std::shared_ptr<const ActivationOffload> offload, std::vector<bool> blocks);
  /// The offload of the flagged layers, or null when none is set.
  const ActivationOffload* activation_offload() const { return activation_offload_.get(); }

 private:
  ModelSpec spec_;
  bool checkpointing_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::function<void(size_t)> before_block_;
  std::vector<bool> host_blocks_;
  std::shared_ptr<const ActivationOffload> activation_offload_;
  std::vector<bool> offloaded_blocks_;
  std::set<std::string> vocab_names_;  // the embedding's and lm_head's names: rows of the vocabulary
};

/// x on `device` inside autograd: a device-to-host copy lands in pinned memory (the calling thread
/// waits only for the copy), a host-to-device copy leaves from pinned memory without blocking the
/// host; the backward copies the gradient the other way. Same device: x itself.
torch::Tensor cross_device(const torch::Tensor& x, c10::Device device);

/// Note [Activation offload]: the first `layers` decoder layers of `model` (-1: all, 0: none) offload
/// their activations; refused (UserError) on a CPU device, where they are in host memory already,
/// and past the model's layer count. `host_slab` makes the host memory they go to (Note [Activation
/// host arena]; memory/pinned.h's pinned_slabs() in a run); empty = LibTorch's pinned allocator.
void offload_activations(Model& model, int64_t layers, const c10::Device& device, HostArena::Allocator host_slab = {});

/// Builds the model for a spec, initialised from torch's current RNG; only Blocks [fill.first,
/// fill.second) are filled (Note [Stage build]).
std::shared_ptr<Model> build_model(const ModelSpec& spec, bool checkpointing,
                                   std::pair<size_t, size_t> fill = {0, std::numeric_limits<size_t>::max()});

}  // namespace tandem
