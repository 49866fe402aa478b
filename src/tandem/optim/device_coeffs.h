#pragma once
// The device Adam's coefficients (Note [Device Adam]) from the CPU kernels' own: the same fp32
// values, so both sides compute the same bits.

#include "tandem/kernels/device_adam_coeffs.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {

/// The coefficients of one update of a span whose weight decay is scaled by `weight_decay_scale`
/// and whose group (null: none) sets its own lr, betas, eps and weight decay; `h.rule` Adam or AdamW.
DeviceAdamCoeffs device_adam_coeffs(const UpdateHyper& h, float weight_decay_scale, const GroupHyper* group);

}  // namespace tandem
