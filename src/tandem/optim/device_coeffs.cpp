#include "tandem/optim/device_coeffs.h"

#include "tandem/core/error.h"

namespace tandem {

DeviceAdamCoeffs device_adam_coeffs(const UpdateHyper& h, float weight_decay_scale, const GroupHyper* group) {
  TANDEM_ASSERT(h.rule == UpdateRule::kAdamW || h.rule == UpdateRule::kAdam, "the device Adam given another rule");
  UpdateSpan span;  // what the coefficients read of a span: its weight decay's scale and its group
  span.weight_decay_scale = weight_decay_scale;
  span.group = group;
  const detail::UpdateCoeffs k = detail::make_coeffs(h, span);
  DeviceAdamCoeffs c;
  c.decoupled = k.rule == UpdateRule::kAdamW;
  c.stochastic = k.rounding == Rounding::kStochastic;
  c.grad_scale = k.grad_scale;
  c.b1 = k.b1;
  c.omb1 = k.omb1;
  c.b2 = k.b2;
  c.omb2 = k.omb2;
  c.eps = k.eps;
  c.inv_sqrt_bc2 = k.inv_sqrt_bc2;
  c.neg_step_size = k.neg_step_size;
  c.decay = k.decay;
  c.wd = k.wd;
  c.seed = k.seed;
  return c;
}

}  // namespace tandem
