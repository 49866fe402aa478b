#pragma once
// The shapes and the geometry of the persistent decode step (Note [Persistent decode step] in
// kernels/decode_step.h): which weight rows each block streams, in how many stages, and how its
// shared memory is cut. Host and device code; plain C++, so the planner is tested without a GPU.

#include <cstdint>
#include <string>

#include "tandem/kernels/host_device.h"
#include "tandem/kernels/qkv_units.h"

namespace tandem::detail {

/// The step's shapes: `rows` new tokens (one per sequence) through n_layer layers of width C, H
/// query and KV key/value heads of hd dimensions (RoPE on the first `rotary`), a gated feed-forward
/// of F, a vocabulary of V; matrices of elem_bytes-byte elements; pages of page_tokens tokens.
struct DecodeStepDims {
  int64_t n_layer = 0, rows = 0, C = 0, H = 0, KV = 0, hd = 0, rotary = 0, F = 0, V = 0, page_tokens = 0;
  int64_t elem_bytes = 2;
  float eps = 1e-5f, scale = 1.0f;
  bool plus_one = false;  ///< norms scale by 1 + w (Gemma's)
};

/// The matrices of a layer, and the output projection, in the order their rows stream.
enum class StepMatrix : int { kQkv, kO, kGateUp, kDown, kHead };

/// A matrix cut into units, each a warp's: `units` of up to `unit_rows` rows of K elements.
struct MatrixUnits {
  int64_t units = 0, K = 0;
  int unit_rows = 1;
};

TANDEM_HOST_DEVICE QkvShape qkv_shape(const DecodeStepDims& d) { return QkvShape{d.H, d.KV, d.hd, d.rotary}; }

/// How matrix m is cut: the q/k/v projection into qkv_unit's units, the (gate, up) product into
/// feature f's two rows (f and F + f), the others into single rows.
TANDEM_HOST_DEVICE MatrixUnits matrix_units(const DecodeStepDims& d, StepMatrix m) {
  switch (m) {
    case StepMatrix::kQkv:
      return MatrixUnits{qkv_units(qkv_shape(d)), d.C, 2};
    case StepMatrix::kO:
      return MatrixUnits{d.C, d.H * d.hd, 1};
    case StepMatrix::kGateUp:
      return MatrixUnits{d.F, d.C, 2};
    case StepMatrix::kDown:
      return MatrixUnits{d.C, d.F, 1};
    default:
      return MatrixUnits{d.V, d.C, 1};
  }
}

/// Bytes a unit's place in a stage takes (its largest number of rows).
TANDEM_HOST_DEVICE int64_t unit_bytes(const DecodeStepDims& d, const MatrixUnits& u) {
  return u.unit_rows * u.K * d.elem_bytes;
}

/// The most stages a block's ring of shared memory holds, and the bytes the ring's other tenants take.
constexpr int kDecodeStepMaxSlots = 16;
constexpr int64_t kDecodeStepHeaderBytes = 512;  // the ring's barriers, the norm's sums, flags
/// The groups of consumer warps in a block; stage s is group s % kDecodeStepGroups's, and the slots
/// are a multiple of the groups, so that each slot is always the same group's.
constexpr int kDecodeStepGroups = 4;

/// Where a block's shared memory goes, and how many blocks run (one per multiprocessor).
struct DecodeStepPlan {
  int blocks = 0;
  int slots = 0;           ///< stages in flight in a block's ring
  int64_t slot_bytes = 0;  ///< bytes of one stage
  int64_t x_bytes = 0;     ///< the rows a product reads, or the attention's items
  int64_t smem_bytes = 0;  ///< dynamic shared memory a block takes
};

/// The units of matrix m in one stage of `slot_bytes`.
TANDEM_HOST_DEVICE int64_t units_per_stage(const DecodeStepDims& d, StepMatrix m, int64_t slot_bytes) {
  const MatrixUnits u = matrix_units(d, m);
  return slot_bytes / unit_bytes(d, u);
}

/// Block b's units [begin, end) of matrix m (of `blocks` blocks), and its stages.
struct BlockUnits {
  int64_t begin = 0, end = 0, per_stage = 1, stages = 0;
};
TANDEM_HOST_DEVICE BlockUnits block_units(const DecodeStepDims& d, const DecodeStepPlan& p, StepMatrix m, int64_t b) {
  const int64_t units = matrix_units(d, m).units;
  BlockUnits u;
  u.begin = units * b / p.blocks;
  u.end = units * (b + 1) / p.blocks;
  u.per_stage = units_per_stage(d, m, p.slot_bytes);
  u.stages = (u.end - u.begin + u.per_stage - 1) / u.per_stage;
  return u;
}

/// The plan for `d` on a GPU of `sm_count` multiprocessors and `max_shared` bytes of shared memory a
/// block, into *plan; or why the step does not take `d` (empty when it does).
std::string plan_decode_step(const DecodeStepDims& d, int sm_count, int64_t max_shared, DecodeStepPlan* plan);

}  // namespace tandem::detail
