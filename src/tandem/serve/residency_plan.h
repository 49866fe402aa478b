#pragma once
// Which decoder layers' weights stay on the device when a model's weights do not all fit there.
//
// Note [Streamed layers]
// Generation reads every weight once per decode step, so a layer that is not resident must cross
// the bus once per step. The plan keeps the first layers resident and streams the rest from pinned
// host memory through `slots` device buffers, each uploaded on a side stream while earlier layers
// compute (LayerStream, one or two layers ahead). Which layers stay does not change the bytes
// streamed per step; keeping the first ones lets the uploads of the first streamed layers of the
// next step overlap the embedding, the head and the resident layers. The embedding, the final
// norm and the output projection are always resident: the embedding is one gather and the head is
// the largest single matrix product. A streamed step costs at least (streamed bytes) / (host-to-
// device bandwidth); docs/generate.md shows the figures.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/models/spec.h"

namespace tandem {

/// Where a decoder layer's weights live between uses.
enum class LayerHome { kDevice, kHost };

/// The decision (Note [Streamed layers]).
struct ResidencyPlan {
  std::vector<LayerHome> layers;  ///< per decoder layer
  int64_t slots = 0;              ///< device buffers the streamed layers pass through; 0 when none is streamed
  int64_t layer_bytes = 0;        ///< one decoder layer's weights
  int64_t fixed_bytes = 0;        ///< embedding, final norm and (untied) output projection

  /// Layers streamed from host memory, and layers resident on the device.
  int64_t streamed() const;
  int64_t resident() const { return static_cast<int64_t>(layers.size()) - streamed(); }
  /// Weights on the device: fixed, resident layers, slots.
  int64_t device_bytes() const { return fixed_bytes + (resident() + slots) * layer_bytes; }
  /// Weights in pinned host memory: the streamed layers.
  int64_t host_bytes() const { return streamed() * layer_bytes; }
  /// One line: "all 32 layers resident (12.6 GiB)" or "20 of 40 layers resident, 20 streamed ...".
  std::string describe() const;
};

/// Elements of one decoder layer's weights as a checkpoint stores them (HF shapes).
int64_t decoder_layer_numel(const ModelSpec& spec);
/// Elements of the embedding, the final norm and the untied output projection.
int64_t decoder_fixed_numel(const ModelSpec& spec);

/// The most resident layers whose weights, with the fixed ones and `prefetch_layers` + 1 slots for
/// the rest, fit `device_budget_bytes` (< 0: no limit, every layer resident). UserError naming the
/// numbers when not even the fixed weights and the slots fit.
ResidencyPlan plan_residency(const ModelSpec& spec, torch::ScalarType dtype, int64_t device_budget_bytes,
                             int64_t prefetch_layers);

}  // namespace tandem
