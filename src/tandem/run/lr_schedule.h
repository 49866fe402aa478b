#pragma once
#include "tandem/core/config.h"

namespace tandem {

/// Learning rate for optimizer step `step` (0-based): linear warmup from warmup_min_lr to lr over
/// warmup_steps, then cosine, linear or constant down to lr * min_lr_ratio at decay_steps.
double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps);

}  // namespace tandem
