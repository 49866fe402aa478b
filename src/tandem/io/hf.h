#pragma once
// HF LLaMA interop: config.json <-> ModelSpec, and loading model.safetensors (single file or
// shards listed in model.safetensors.index.json) into a Model.

#include <string>

#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {

/// The HF config.json text for a spec (LlamaForCausalLM, or tandem's own type for the MLP and MoE
/// models), in the layout that transformers 4.x and 5.x both read (top-level rope_theta and
/// rope_scaling, torch_dtype).
std::string hf_config_json(const ModelSpec& spec, const std::string& torch_dtype = "float32");

/// Parses an HF config.json (model_type llama, as transformers 4.x or 5.x writes it, or one of
/// tandem's own types); UserError naming `origin` and the key for a value of the wrong type, a
/// setting tandem does not implement or a key it does not know (Note [HF config keys]).
ModelSpec spec_from_hf_config_text(const std::string& text, const std::string& origin);
ModelSpec spec_from_hf_config(const std::string& path);

/// Loads weights from an HF model directory into `model` (dtype converted); UserError naming the
/// first missing tensor or the first whose shape differs.
void load_hf_weights(Model& model, const std::string& dir);

/// Writes `model` as an HF directory: config.json and model.safetensors (fp32 or `dtype`).
void save_hf_model(Model& model, const std::string& dir);

}  // namespace tandem
