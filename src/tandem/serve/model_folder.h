#pragma once
// Where generation's weights come from: `--checkpoint DIR` names a tandem checkpoint (step_*), a run
// directory (its newest intact checkpoint) or a Hugging Face model folder of a supported family;
// all hold config.json and safetensors with HF names (formats/weight_files.h reads them).

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

/// The folder found for a --checkpoint path, and what config.json says.
struct ModelFolder {
  std::string dir;               ///< the folder holding config.json and the weights
  ModelSpec spec;                ///< from config.json
  std::vector<TokenId> eos_ids;  ///< config.json's eos_token_id (a number or a list); empty when absent
};

/// Finds the folder (a run directory resolves to its newest intact checkpoint) and reads its
/// config.json. UserError naming the path and the fix when there is no decoder model there.
ModelFolder open_model_folder(const std::string& path);

}  // namespace tandem
