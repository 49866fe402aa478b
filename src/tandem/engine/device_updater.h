#pragma once
// The device side of the update split (Note [Update split]): the GPU-updated Blocks' update, run by
// the step loop once the clip is known, over their device-resident fp32 masters and fp32 or bf16
// states: the device Adam kernel on a GPU, which writes the working weights in the same pass (Note
// [Device Adam]; ATen's fused AdamW where it is missing), the CPU kernel of the CPU side with the CPU
// as the device (Note [One update kernel on the CPU device]). Stamps the
// update's start and end for the split tuner and the trace. Owns nothing but that update.

#include <torch/torch.h>

#include <vector>

#include "tandem/engine/param_store.h"
#include "tandem/engine/step_stamps.h"
#include "tandem/engine/transfer_streams.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

class DeviceUpdater {
 public:
  /// `adam` for the GPU's fused AdamW; `hyper` (the same coefficients and the state rounding) and
  /// `pool` for the CPU kernel on the CPU device. `streams` is null with the CPU as the device.
  DeviceUpdater(ParamStore& store, AdamWOptions adam, UpdateHyper hyper, CpuThreadPool* pool,
                const TransferStreams* streams, StepStamps& stamps);

  /// Updates every GPU-updated Block at `lr` with the 1-based update count `step`, each gradient
  /// multiplied by `grad_scale`; on the compute stream. Nothing (and no stamp) when there are none.
  void update(double lr, int64_t step, double grad_scale);

 private:
  /// The fused kernel's lists for one set of hyper-parameters: the engine's with or without weight
  /// decay (1-D parameters), or a parameter group's (Note [Parameter groups]).
  struct FusedBucket {
    GroupHyper hyper;
    std::vector<torch::Tensor> params, grads, m, v;
  };
  /// Note [Device Adam]: one Block by the device kernel, the working copy written by it; false
  /// where the kernel does not take it (no CUDA kernels in the build, an SGD or Lion rule).
  bool update_with_kernel(size_t block, double lr, int64_t step, double grad_scale,
                          const std::vector<GroupHyper>* groups);
  /// One Block by ATen's fused kernel over fp32 states, then the master copied to the working copy.
  void update_fused(size_t block, double lr, int64_t step, double grad_scale, const std::vector<GroupHyper>* groups);
  std::vector<FusedBucket> fused_buckets(size_t block, const torch::Tensor& m, const torch::Tensor& v, double lr,
                                         double grad_scale, const std::vector<GroupHyper>* groups);
  void run_fused(std::vector<FusedBucket>& buckets, int64_t step);
  void update_on_host(const std::vector<size_t>& blocks, double lr, int64_t step, double grad_scale);
  void mark_on_compute(Stamp& st);

  ParamStore& store_;
  const AdamWOptions adam_;
  const UpdateHyper hyper_;
  CpuThreadPool* const pool_;
  const TransferStreams* const streams_;  // null: the CPU device
  StepStamps& stamps_;
};

}  // namespace tandem
