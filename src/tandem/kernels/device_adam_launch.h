#pragma once
// Launcher of the device-side Adam kernel (kernels/device_adam.cu): raw device pointers and an
// explicit stream, no LibTorch. See Note [Device Adam].

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tandem/kernels/device_adam_coeffs.h"
#include "tandem/kernels/element_type.h"

namespace tandem::detail {

/// One span: master (n) fp32, updated in place; grad (n) `grad_type`; m and v (n) `state_type`
/// (fp32 or bf16); out (n) `out_type` or null: the updated master rounded to nearest even.
struct DeviceAdamSpan {
  float* master = nullptr;
  const void* grad = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  void* out = nullptr;
  int64_t n = 0;
  uint64_t index_base = 0;  ///< the parameter-space index of element 0 (stochastic rounding)
};

void launch_device_adam(const DeviceAdamSpan& s, const DeviceAdamCoeffs& c, ElementType grad_type,
                        ElementType state_type, ElementType out_type, cudaStream_t stream);

}  // namespace tandem::detail
