#pragma once
// `tandem bench step`: the forward and backward of a training step alone, with weights and
// gradients in the compute dtype resident on the device and no optimizer: the GPU-only bound the
// offload engine's step time is measured against (docs/benchmarks.md).

#include <string>

#include "tandem/core/config.h"

namespace tandem {

/// Times cfg.train.steps forward+backward passes (the first two untimed) of cfg's model at
/// micro_batch x seq_len with cfg.model.checkpointing; prints one line per step and a summary, and
/// appends one JSON object to `json_path` when given; writes the model's HF config.json to
/// `model_json` when given (for peers that build the same architecture). Returns 0.
int run_step_bench(const Config& cfg, const std::string& json_path, const std::string& model_json = "");

}  // namespace tandem
