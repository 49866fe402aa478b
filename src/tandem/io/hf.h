#pragma once
// HF LLaMA interop: config.json <-> ModelSpec, and loading model.safetensors (single file or
// shards listed in model.safetensors.index.json) into a Model.

#include <string>

#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {

/// The HF config.json text for a spec (LlamaForCausalLM, or tandem's own type for the MLP).
std::string hf_config_json(const ModelSpec& spec, const std::string& torch_dtype = "float32");

/// Parses an HF config.json (model_type llama); UserError naming the unsupported field otherwise.
ModelSpec spec_from_hf_config_text(const std::string& text, const std::string& origin);
ModelSpec spec_from_hf_config(const std::string& path);

/// Loads weights from an HF model directory into `model` (dtype converted); UserError naming the
/// first missing tensor or the first whose shape differs.
void load_hf_weights(Model& model, const std::string& dir);

/// Writes `model` as an HF directory: config.json and model.safetensors (fp32 or `dtype`).
void save_hf_model(Model& model, const std::string& dir);

}  // namespace tandem
