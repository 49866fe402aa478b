#pragma once
// HF model folders: loading model.safetensors (single file or shards listed in
// model.safetensors.index.json) into a Model, and writing a Model as a folder. config.json is
// io/hf_config.h's.

#include <string>

#include "tandem/io/hf_config.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {

/// Loads weights from an HF model directory into `model` (dtype converted); UserError naming the
/// first missing tensor or the first whose shape differs.
void load_hf_weights(Model& model, const std::string& dir);

/// Writes `model` as an HF directory: config.json and model.safetensors (fp32 or `dtype`).
void save_hf_model(Model& model, const std::string& dir);

}  // namespace tandem
