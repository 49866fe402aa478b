#pragma once
// The CPU update kernel's view of a Block (optim/cpu_update.h): its spans and undo logs over the
// Block's slice of the ParamStore, and the coefficients of one of the engine's updates. Shared by
// every caller of the kernel in the engine: the CPU updater, the device side on the CPU device
// (Note [One update kernel on the CPU device]) and the split tuner's calibration, so all of them
// run the same kernel on the same layout.

#include <torch/torch.h>

#include <vector>

#include "tandem/engine/param_store.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {

/// One span per parameter piece of b's slice (b.shard_params): the master, m and v of b, the
/// gradient read from `grad` (fp32 or bf16), and the new weights written into `out` when it is bf16
/// (otherwise the caller copies the master). `grad` and `out` hold at least the slice, contiguous.
/// `groups` (Note [Parameter groups]): the table each grouped parameter's span points into; null:
/// every span takes the call's hyper-parameters.
std::vector<UpdateSpan> block_update_spans(BlockStore& b, const torch::Tensor& grad, const torch::Tensor& out,
                                           const std::vector<GroupHyper>* groups = nullptr);

/// The undo logs matching block_update_spans(b, ...): b's undo buffers (speculative updates).
std::vector<UndoLog> block_undo_logs(BlockStore& b);

/// `base` (rule, betas, eps, weight decay, state rounding) for one update at `lr`, the 1-based
/// `step` and `grad_scale`, without the kernel's non-finite scan: the global norm decides
/// (Note [Speculative clipping]).
UpdateHyper update_hyper(UpdateHyper base, double lr, int64_t step, double grad_scale);

}  // namespace tandem
