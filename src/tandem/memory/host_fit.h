#pragma once
// Whether a run fits the host's memory, checked before anything is allocated (Note [Host fit]).
// Torch-free, so `tandem inspect` and the tests check machines they do not run on.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/memory/plan.h"
#include "tandem/models/spec.h"

namespace tandem {

/// What a run holds in host memory at its peak, by purpose.
struct HostDemand {
  std::vector<std::pair<std::string, int64_t>> rows;
  int64_t total() const;
};

/// A run without the offload engine: on the CPU every row of the training estimate (the device is
/// the host); on a GPU the fp32 model built on the host before it moves.
HostDemand host_demand(const ModelSpec& spec, const Config& cfg, int64_t seq_len, bool cpu_device);

/// An offload run: the plan's host rows (its build-time fp32 model is freed Block by Block as the
/// store fills and is not counted); on the CPU as the device the device rows too.
HostDemand host_demand(const MemoryPlan& plan, bool cpu_device);

/// UserError with the total, its largest rows, the available memory and what to change, when the
/// demand exceeds `available` bytes; nothing is checked when `available` is 0 (unknown).
void check_host_fits(const HostDemand& demand, int64_t available, const ModelSpec& spec, const Config& cfg,
                     bool cpu_device);

/// A run without the offload engine on a GPU of `gpu_total` bytes, this rank's Blocks and
/// micro-batches in flight as `layout` says (Note [Plan layout]): UserError when its fp32 weights,
/// gradients and AdamW states alone (with NCCL's buffers) exceed the GPU (no micro-batch makes it
/// fit), or when the estimate at train.micro_batch exceeds the GPU more than twice over (a misfit
/// the out-of-memory retry would take many halvings to find; with several ranks, which do not
/// retry, when it exceeds the GPU at all), naming the largest micro-batch the estimate fits.
void check_gpu_fit(const ModelSpec& spec, const Config& cfg, int64_t seq_len, int64_t gpu_total,
                   const PlanLayout& layout = {});

}  // namespace tandem
