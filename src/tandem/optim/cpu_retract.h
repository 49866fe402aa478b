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

}  // namespace tandem
