// The persistent decode step's planner (Note [Persistent decode step]).

#include "tandem/kernels/decode_step_plan.h"

#include <algorithm>

#include "tandem/core/strings.h"
#include "tandem/kernels/paged_item.h"

namespace tandem::detail {
namespace {

// The fused norm's reach: rows of up to 4 x 512 x 4 elements (kernels/decode_fusions.cuh).
constexpr int64_t kNormMaxWidth = 8192;
constexpr int64_t kMaxRows = 4;
constexpr int kMaxQueryGroup = 8;  // query heads a key/value head (the attention's G_MAX)

constexpr StepMatrix kMatrices[] = {StepMatrix::kQkv, StepMatrix::kO, StepMatrix::kGateUp, StepMatrix::kDown,
                                    StepMatrix::kHead};

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

std::string shape_refusal(const DecodeStepDims& d) {
  if (d.rows < 1 || d.rows > kMaxRows)
    return strprintf("%lld rows (it takes 1 to %lld)", (long long)d.rows, (long long)kMaxRows);
  if (d.elem_bytes != 2) return "matrices of 4-byte elements (it takes fp16 and bf16)";
  if (d.hd != 64 && d.hd != 128) return strprintf("heads of %lld dimensions (it takes 64 and 128)", (long long)d.hd);
  if (d.KV < 1 || d.H % d.KV != 0 || d.H / d.KV > kMaxQueryGroup)
    return strprintf("%lld query heads over %lld key/value heads", (long long)d.H, (long long)d.KV);
  if (d.rotary % 2 != 0 || d.rotary > d.hd)
    return strprintf("RoPE over %lld of %lld dimensions", (long long)d.rotary, (long long)d.hd);
  for (const int64_t k : {d.C, d.F, d.H * d.hd})
    if (k % 8 != 0) return strprintf("a product over %lld features (a multiple of 8 is needed)", (long long)k);
  if (d.C > kNormMaxWidth) return strprintf("a width of %lld (at most %lld)", (long long)d.C, (long long)kNormMaxWidth);
  return "";
}

// The smallest share of a full ring that any matrix's stages fill with `slots` stages of `slot` bytes
// (0 where a unit does not fit a stage).
int64_t filled(const DecodeStepDims& d, int slots, int64_t slot) {
  int64_t least = slots * slot;
  for (const StepMatrix m : kMatrices) {
    const int64_t unit = unit_bytes(d, matrix_units(d, m));
    if (unit > slot) return 0;
    least = std::min(least, slots * (slot / unit) * unit);
  }
  return least;
}

}  // namespace

std::string plan_decode_step(const DecodeStepDims& d, int sm_count, int64_t max_shared, DecodeStepPlan* plan) {
  if (std::string why = shape_refusal(d); !why.empty()) return why;
  DecodeStepPlan p;
  p.blocks = sm_count;
  const int64_t widest = std::max({d.C, d.F, d.H * d.hd});
  const int64_t rows_bytes = d.rows * widest * d.elem_bytes;
  const int64_t items_bytes = kDecodeStepGroups * paged_item_floats(d.H / d.KV, d.hd) * 4;
  p.x_bytes = round_up(std::max(rows_bytes, items_bytes), 128);
  const int64_t ring = max_shared - kDecodeStepHeaderBytes - p.x_bytes;
  // Two stages or more a group where a unit fits (one in flight while the other is read), else one.
  int64_t best = 0;
  for (const int least : {2 * kDecodeStepGroups, kDecodeStepGroups}) {
    for (int slots = least; slots <= kDecodeStepMaxSlots; slots += kDecodeStepGroups) {
      const int64_t slot = ring / slots / 128 * 128;
      if (slot <= 0) break;
      const int64_t f = filled(d, slots, slot);
      if (f > best) best = f, p.slots = slots, p.slot_bytes = slot;
    }
    if (best > 0) break;
  }
  if (best == 0)
    return strprintf("%lld bytes of shared memory, too few for %d stages of its largest unit beside %lld bytes of rows",
                     (long long)max_shared, kDecodeStepGroups, (long long)p.x_bytes);
  p.smem_bytes = kDecodeStepHeaderBytes + p.x_bytes + p.slots * p.slot_bytes;
  *plan = p;
  return "";
}

}  // namespace tandem::detail
