#pragma once
// The update of device-resident parameters (no offload engine), shared by the CLI's step loop and
// the Python engine: fp16 gradients unscaled with the non-finite check, the global norm, clipping
// and the optimizer's step, all without a host synchronisation; and the dynamic loss scale's update.

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <vector>

#include "tandem/core/config.h"

namespace tandem {

class Optimizer;

/// The step's update of `params` (every trainable tensor once). `scale`: the fp16 loss scale (1)
/// the gradients carry, or nullopt. `found_inf` (0-d fp32, zero on entry) is set when a gradient is
/// not finite, in which case the optimizer skips; returns the global norm before clipping (0-d).
/// `global_norm`: the norm of every process's parameters from the norm of these (a pipeline's
/// stages, Note [Pipeline parallel]); empty = these are all.
torch::Tensor resident_update(std::vector<torch::Tensor>& params, Optimizer& optimizer, double lr, double grad_clip,
                              const std::optional<torch::Tensor>& scale, torch::Tensor& found_inf,
                              const std::function<torch::Tensor(const torch::Tensor&)>& global_norm = {});

/// Dynamic loss scaling after a step: backs off on `found_inf`, grows after sc.growth_interval
/// clean steps, never below sc.min_scale. `scale` (1) fp32 and `growth_tracker` (1) int32.
void update_loss_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                       const ScalerConfig& sc);

}  // namespace tandem
