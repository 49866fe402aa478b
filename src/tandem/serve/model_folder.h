#pragma once
// Where generation's weights come from: `--checkpoint DIR` names a tandem checkpoint (step_*), a run
// directory (its newest intact checkpoint) or a Hugging Face Llama folder; all hold config.json and
// safetensors with HF names (model.safetensors, or shards listed in model.safetensors.index.json).

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/data/tokenizer.h"
#include "tandem/models/spec.h"
#include "tandem/serve/decoder_weights.h"

namespace tandem {

class SafetensorsFile;

/// The folder found for a --checkpoint path, and what config.json says.
struct ModelFolder {
  std::string dir;               ///< the folder holding config.json and the weights
  ModelSpec spec;                ///< from config.json
  std::vector<TokenId> eos_ids;  ///< config.json's eos_token_id (a number or a list); empty when absent
};

/// Finds the folder (a run directory resolves to its newest intact checkpoint) and reads its
/// config.json. UserError naming the path and the fix when there is no Llama model there.
ModelFolder open_model_folder(const std::string& path);

/// The safetensors files of a folder, memory-mapped, by tensor name.
class WeightFiles {
 public:
  /// UserError when the folder has neither model.safetensors nor a valid index with its shards.
  explicit WeightFiles(const std::string& dir);
  ~WeightFiles();
  WeightFiles(const WeightFiles&) = delete;
  WeightFiles& operator=(const WeightFiles&) = delete;

  /// A host copy of the named tensor in its stored dtype, or nullopt when no file has it.
  std::optional<torch::Tensor> tensor(const std::string& name) const;
  /// tensor() as a TensorLookup (valid while this object lives).
  TensorLookup lookup() const;
  /// What errors name: "<dir>/model.safetensors" or "<dir>/model.safetensors.index.json".
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name_;
};

}  // namespace tandem
