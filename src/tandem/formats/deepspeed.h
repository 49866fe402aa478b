#pragma once
// DeepSpeed JSON configs read into tandem's keys: micro batch, accumulation and the global batch
// over WORLD_SIZE ranks, clipping, Adam/AdamW parameters, the WarmupLR, WarmupDecayLR and
// WarmupCosineLR schedules, bf16/fp16 with the loss-scale fields, ZeRO stages with
// offload_optimizer. Every field is type-checked; the keys that do not map are returned.

#include <string>
#include <vector>

#include "tandem/core/config.h"

namespace tandem {

/// Result of reading a DeepSpeed JSON config: the keys it could not map, and how the ones mapped
/// only in part were read (one line each).
struct DeepSpeedImport {
  std::vector<std::string> ignored_keys;
  std::vector<std::string> notes;
};

/// Loads the DeepSpeed keys that map onto tandem's; returns the ones it ignored. UserError naming
/// the file and the key for a field of the wrong type or an impossible combination.
DeepSpeedImport load_deepspeed_config(Config& cfg, const std::string& path);
DeepSpeedImport load_deepspeed_config_text(Config& cfg, const std::string& text, const std::string& origin);

}  // namespace tandem
