#pragma once
// Taking back a speculative Adam update without an undo log: each element's master and moments
// solved back from their updated values and the gradient (Note [Retraction]).

#include <vector>

#include "tandem/optim/cpu_update.h"

namespace tandem {

/// Takes back the Adam or AdamW update that cpu_update(spans, hyper) applied to these spans (the
/// same gradients, grad_scale, lr and step), with no undo log: master, m and v come back to their
/// values before it up to rounding (Note [Retraction] bounds it), and the span's bf16 copy is
/// rewritten from the restored master. Tiles the update left untouched for a non-finite gradient
/// are left untouched here too. On `pool` (the global pool when null).
void cpu_retract(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper, CpuThreadPool* pool = nullptr);

/// What cpu_retract_and_update did: the update's report, and the share of the pass's time that went
/// to taking the first update back (the rest is the update's).
struct RetractAndUpdate {
  UpdateReport report;
  double retract_share = 0.0;
};

/// cpu_retract(spans, taken_back) then cpu_update(spans, hyper), chunk by chunk: each chunk is
/// solved back and updated again while it is in cache, one sweep of host memory where the two calls
/// take two (Note [Retraction]). The spans end as the two calls leave them, bit for bit.
RetractAndUpdate cpu_retract_and_update(const std::vector<UpdateSpan>& spans, const UpdateHyper& taken_back,
                                        const UpdateHyper& hyper, CpuThreadPool* pool = nullptr);

}  // namespace tandem
