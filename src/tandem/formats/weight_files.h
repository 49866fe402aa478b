#pragma once
// The weights of a model folder: model.safetensors, or the shards model.safetensors.index.json
// lists, memory-mapped and looked up by HF tensor name.

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

class SafetensorsFile;

/// A tensor by its HF name (any float dtype, on the CPU), or nullopt when absent.
using TensorLookup = std::function<std::optional<torch::Tensor>(const std::string& name)>;

/// Whether `dir` holds model.safetensors or model.safetensors.index.json.
bool has_weight_files(const std::string& dir);

/// The safetensors files of a folder, by tensor name.
class WeightFiles {
 public:
  /// UserError when the folder has neither model.safetensors nor a valid index with its shards.
  /// `base`: the family's prefix ("model.", "transformer."): a folder saved from the base model
  /// names its tensors without it ("h.0.attn.c_attn.weight"), and they are found under the prefixed
  /// name as transformers finds them.
  WeightFiles(const std::string& dir, const std::string& base);
  ~WeightFiles();
  WeightFiles(const WeightFiles&) = delete;
  WeightFiles& operator=(const WeightFiles&) = delete;

  /// Every tensor's (prefixed) name.
  std::vector<std::string> names() const;
  /// A host copy of the named tensor in its stored dtype, or nullopt when no file has it.
  std::optional<torch::Tensor> tensor(const std::string& name) const;
  /// tensor() as a TensorLookup (valid while this object lives).
  TensorLookup lookup() const;
  /// What errors name: "<dir>/model.safetensors" or "<dir>/model.safetensors.index.json".
  const std::string& source() const { return source_; }

 private:
  struct Entry {
    std::shared_ptr<SafetensorsFile> file;
    std::string stored;  // the name in the file
  };
  std::string source_;
  std::map<std::string, Entry> by_name_;
};

}  // namespace tandem
