#pragma once
// `tandem inspect --partition`: the automatic pipeline partitioner on this machine (Note [Pipeline
// profile], Note [Pipeline partition]): each Block's measured cost, the devices, the plan, and with
// --partition-cpu the host's cores as one more stage (Note [CPU pipeline stage]).

#include <cstdint>

#include "tandem/core/config.h"
#include "tandem/models/spec.h"

namespace tandem {

/// What `inspect --partition` plans for beyond the configuration.
struct PartitionInspectOptions {
  bool with_cpu = false;  ///< also weigh the host CPU as one more stage
  int64_t ranks = 0;      ///< ranks to plan for; 0 = one per visible GPU (1 with the CPU as the device)
};

/// Builds `spec`'s model, profiles its Blocks on train.device, measures the devices and prints the
/// profile, the plan and (with_cpu) the CPU stage's verdict; returns the exit code. UserError when
/// no plan fits.
int run_partition_inspect(const Config& cfg, const ModelSpec& spec, int64_t seq_len,
                          const PartitionInspectOptions& options);

}  // namespace tandem
