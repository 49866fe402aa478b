#pragma once
// The coefficients of one device-side Adam update (Note [Device Adam]), fp32 as the CPU kernels
// round them once per call (optim/cpu_update's UpdateCoeffs), without LibTorch or CUDA headers.

#include <cstdint>

namespace tandem {

struct DeviceAdamCoeffs {
  bool decoupled = true;    ///< AdamW: the master decays by `decay`; Adam: `wd` * master joins the gradient
  bool stochastic = false;  ///< bf16 states rounded stochastically (else to nearest even)
  float grad_scale = 1;
  float b1 = 0, omb1 = 0, b2 = 0, omb2 = 0;  // beta and 1 - beta
  float eps = 0, inv_sqrt_bc2 = 0, neg_step_size = 0;
  float decay = 1, wd = 0;
  uint32_t seed = 0;  ///< the step's seed of the stochastic rounding
};

}  // namespace tandem
