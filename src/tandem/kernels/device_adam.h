#pragma once
// Adam and AdamW on the device for the offload engine's GPU-updated Blocks: the fp32 master, its
// states in fp32 or bf16, the gradient as the backward left it and the working copy written in the
// same pass, with the CPU kernels' arithmetic bit for bit.
//
// Note [Device Adam]
// A GPU-updated Block's update ran as ATen's fused AdamW over fp32 states, after widening the
// gradient to an fp32 scratch and before copying the master into the working weights: three passes,
// 12 bytes a parameter resident, and results that differ from the CPU kernels' in the last bits
// (ATen divides by the bias correction of the square root where the CPU kernels multiply by its
// reciprocal). This kernel makes one pass: it reads the gradient in its own dtype, scales it,
// updates the master and the states with the CPU kernels' operations in their order, each rounded
// once (explicit round-to-nearest intrinsics, so nvcc contracts nothing into a fused multiply-add
// the CPU does not make), and writes the working copy. bf16 states round as the CPU kernels round
// them (nearest even, or stochastically from the same hash of the element's index and the step's
// seed), so which side updates a Block changes when the update runs, not its bits, on a GPU as on
// the CPU device (Note [One update kernel on the CPU device]); and GPU-updated Blocks may keep
// their states in bf16 (optim.device_state_dtype): 8 bytes a parameter resident instead of 12, so
// the GPU holds more of them and the CPU's share of the exact step shrinks (Note [Update split]).

#include <torch/torch.h>

#include "tandem/kernels/device_adam_coeffs.h"

namespace tandem {

/// Whether device_adam() takes these: CUDA tensors on one device, contiguous, of one length; master
/// fp32; grad and out (out may be undefined) fp32, fp16 or bf16; m and v both fp32 or both bf16; in
/// a build with the CUDA kernels.
bool device_adam_takes(const torch::Tensor& master, const torch::Tensor& grad, const torch::Tensor& m,
                       const torch::Tensor& v, const torch::Tensor& out);

/// One Adam (AdamW with c.decoupled) update of master, m and v in place on the current stream,
/// and out = the new master rounded to nearest even. `index_base` is element 0's index in the
/// parameter space (the stochastic rounding's stream, as UpdateSpan::index_base).
void device_adam(const torch::Tensor& master, const torch::Tensor& grad, const torch::Tensor& m,
                 const torch::Tensor& v, const torch::Tensor& out, const DeviceAdamCoeffs& c, uint64_t index_base);

namespace detail {

/// The CUDA implementation, registered by the CUDA build (kernels/device_adam_cuda.cpp).
using DeviceAdamFn = void (*)(const torch::Tensor& master, const torch::Tensor& grad, const torch::Tensor& m,
                              const torch::Tensor& v, const torch::Tensor& out, const DeviceAdamCoeffs& c,
                              uint64_t index_base);
DeviceAdamFn& device_adam_cuda();

}  // namespace detail
}  // namespace tandem
