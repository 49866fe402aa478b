#pragma once
// How many decoder layers `model.activation_offload=auto` sends to pinned host memory: as many as
// the host link hides under the step (Note [Automatic activation offload]).

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "tandem/core/config.h"
#include "tandem/models/spec.h"

namespace tandem {

/// The two rates the choice weighs: the device's matrix product rate on one of a layer's products,
/// and its pinned host link one way.
struct ActivationRates {
  double flops_per_s = 0;
  double link_bytes_per_s = 0;
};

/// Times a layer's largest product (micro-batch x seq_len tokens by d_model by d_ff, in the run's
/// precision) and a 64 MiB copy into pinned host memory on `device`: a fifth of a second at most.
ActivationRates measure_activation_rates(const ModelSpec& spec, const Config& cfg, int64_t seq_len,
                                         const c10::Device& device);

struct ActivationChoice {
  int64_t layers = 0;
  std::string why;  ///< one line for the log: the rule's terms, or why none
};

/// Why auto offloads no layer whatever the rates ("" when the rates decide): no checkpointing, the
/// offload engine, a pipeline.
std::string activation_offload_excluded(const Config& cfg);

/// The layers to offload for a run of `cfg` on a GPU with these rates: 0 without checkpointing,
/// with the offload engine or with a pipeline; else the rule's count, at most what fits in
/// `host_room` bytes of host memory (< 0: unknown, no cap) and at most the model's layers.
ActivationChoice choose_offloaded_layers(const ModelSpec& spec, const Config& cfg, int64_t seq_len,
                                         const ActivationRates& rates, int64_t host_room);

/// `cfg` with model.activation_offload resolved when it is auto (measured on `device`, logged);
/// unchanged otherwise. On the CPU auto is 0.
Config resolve_activation_offload(Config cfg, const ModelSpec& spec, int64_t seq_len, const c10::Device& device,
                                  int64_t host_room);

}  // namespace tandem
