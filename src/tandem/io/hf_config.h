#pragma once
// HF config.json <-> ModelSpec for the decoder families (Note [Decoder families]) and tandem's own
// model types.

#include <string>

#include "tandem/models/spec.h"

namespace tandem {

/// The HF config.json text for a spec: its family's model_type and keys (or tandem's own type for
/// the MLP and MoE models), in the layout that transformers 4.x and 5.x both read (top-level
/// rope_theta and rope_scaling, torch_dtype).
std::string hf_config_json(const ModelSpec& spec, const std::string& torch_dtype = "float32");

/// Parses an HF config.json of a supported family (as transformers 4.x or 5.x writes it) or of one
/// of tandem's own types; UserError naming `origin` and the key for a value of the wrong type, a
/// setting tandem does not implement or a key it does not know (Note [HF config keys]).
ModelSpec spec_from_hf_config_text(const std::string& text, const std::string& origin);
ModelSpec spec_from_hf_config(const std::string& path);

}  // namespace tandem
