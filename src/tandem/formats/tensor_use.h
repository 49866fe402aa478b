#pragma once
// Note [Every tensor used]: a weights file's tensors the model never asks for mean the file is of
// another architecture than the one built (a layer count lowered by --set model.n_layer on resume,
// a Qwen2 folder relabelled llama whose q/k/v biases have no place): the load refuses them by name
// instead of training the part of the file that fits. Missing tensors the loaders refuse already.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tandem/formats/weight_files.h"

namespace tandem {

class TensorUse {
 public:
  /// The tensors `source` (a file or a folder, for messages) holds.
  TensorUse(std::vector<std::string> names, std::string source);
  /// `lookup` recording each name asked for.
  TensorLookup recording(TensorLookup lookup) const;
  /// Counts `name` as used (a tensor the model reads through another: a tied lm_head).
  void mark_used(const std::string& name) const { used_->insert(name); }
  /// UserError naming the tensors never asked for (the first few and their count); buffers that
  /// transformers wrote in older checkpoints (rotary_emb.inv_freq, GPT-2's attn.bias and
  /// attn.masked_bias) do not count.
  void check_all_used() const;

 private:
  std::vector<std::string> names_;
  std::string source_;
  std::shared_ptr<std::set<std::string>> used_ = std::make_shared<std::set<std::string>>();
};

}  // namespace tandem
