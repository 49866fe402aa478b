#include "tandem/optim/cpu_retract.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/kernels/bf16_rounding.h"
#include "tandem/optim/cpu_update_chunks.h"
#include "tandem/optim/q8_codes.h"

namespace tandem {

// Note [Retraction]
// A speculative update (Note [Speculative clipping]) that turns out wrong, because the step clips
// or is skipped, must be taken back. With per-Block buffers the engine keeps an undo log, a copy of
// what the update overwrote (8 bytes a parameter with an fp32 master and bf16 states: 104 GB at
// 13B). Where the host cannot hold one (a host ring, Note [Host ring]) the update is solved back
// instead. Adam's update of one element is invertible given its gradient, which the device still
// holds until the step's end:
//   AdamW  p2 = p0 (1 - lr wd) + s m1 / (sqrt(v1) / sqrt(bc2) + eps),  s = -lr / bc1
//          m1 = b1 m0 + (1 - b1) g,   v1 = b2 v0 + (1 - b2) g^2
// so from the stored p2, m1, v1 and g:  p0 = (p2 - s m1 / (...)) / (1 - lr wd),
// m0 = (m1 - (1 - b1) g) / b1,  v0 = max(0, (v1 - (1 - b2) g^2) / b2)  (Adam: g + wd p0 for g).
// The update's step direction is recomputed from the stored m1 and v1, which are what it used
// when the states are fp32. Each solved value is then within a few fp32 roundings of the old one
// (the tests hold an fp32 retraction and redo within 1e-6 of the direct clipped update); with
// bf16 or 8-bit states the direction is recomputed from the rounded states and the old states
// come back rounded once more (to nearest), and a bf16 master comes back rounded to nearest (a
// Kahan pair, as a pair): the error of one more rounding of each, on a step that clips, against
// the undo log's bit-exact copy. That rounding is of the speculative values, while the redone
// update adds the clipped gradient's share: relative to it the error is about the states' precision
// divided by the clip coefficient c (bf16: 2^-9 / c, under 1 % for c > 0.2, 30 % at c = 1/160).
// kAuto speculates only after 8 steps in a row that did not clip, where a clipped step's c is near
// 1; offload.speculate=never keeps every clipped step exact. The first update's moments come back
// as the zeros they were. No tile is solved back where the update skipped it (a non-finite
// gradient after scaling), so a NaN never enters (the engine also speculates on a Block only where
// its squared gradient norm is finite, so no state it solves back has overflowed). With 8-bit
// states a moment whose code lost its value gives back a step that misses the one applied, by up to
// that step. The pass reads and writes what the update does, tile by tile through fp32 arrays, in
// loops the compiler vectorises (cloned for AVX-512 and AVX2): about three times an update's time
// (measured on 2 cores: its arithmetic, not its bytes), paid once per clipped or skipped step, and
// the engine speculates by default only once steps stop clipping (kAuto). A clipped step redoes the
// update at once: cpu_retract_and_update solves each chunk back and updates it again while it is in
// cache, one sweep of host memory for both, where retracting every Block's spans before updating
// them would read and write them twice.

namespace {

using detail::bf16_bits_to_f32;
using detail::f32_to_bf16_bits;

constexpr int64_t kTile = q8::kBlock;  // the update's tile: its non-finite scan and one 8-bit block
static_assert(detail::kUpdateChunk % kTile == 0, "the update's chunks are cut into whole tiles");

// A tile is widened into fp32 arrays, solved back in one loop of plain arithmetic over them (which
// the compiler vectorises: no branch on a dtype, no fused multiply-add, no errno on sqrt) and
// narrowed back into its buffers.
struct Tile {
  alignas(64) float p[kTile], g[kTile], m[kTile], v[kTile];
};

void widen(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void widen(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(src[i]);
}
void narrow(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void narrow(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16_bits(src[i], 0, true);
}

void widen_dtype(const void* p, Dtype d, int64_t t0, float* dst, int64_t n) {
  if (d == Dtype::kF32)
    widen(static_cast<const float*>(p) + t0, dst, n);
  else
    widen(static_cast<const uint16_t*>(p) + t0, dst, n);
}
void narrow_dtype(const float* src, void* p, Dtype d, int64_t t0, int64_t n) {
  if (d == Dtype::kF32)
    narrow(src, static_cast<float*>(p) + t0, n);
  else
    narrow(src, static_cast<uint16_t*>(p) + t0, n);
}

// The master in fp32 into p; a Kahan compensation goes through `scratch` (n floats).
void load_master(const UpdateSpan& s, int64_t t0, int64_t n, float* p, float* scratch) {
  if (s.master != nullptr) return widen(s.master + t0, p, n);
  widen(s.master_bf16 + t0, p, n);
  if (s.master_comp == nullptr) return;
  widen(s.master_comp + t0, scratch, n);
  for (int64_t i = 0; i < n; ++i) p[i] += scratch[i];
}

// The restored master, and the bf16 copy for the device from it: rounded to nearest from an fp32
// master, a bf16 master's own bits.
void store_master(const UpdateSpan& s, int64_t t0, int64_t n, const Tile& t) {
  if (s.master != nullptr) {
    narrow(t.p, s.master + t0, n);
    if (s.bf16_out != nullptr) narrow(t.p, s.bf16_out + t0, n);
    return;
  }
  if (s.master_comp != nullptr)
    for (int64_t i = 0; i < n; ++i) detail::kahan_pair_bits(t.p[i], s.master_bf16 + t0 + i, s.master_comp + t0 + i);
  else
    narrow(t.p, s.master_bf16 + t0, n);
  if (s.bf16_out != nullptr) std::memcpy(s.bf16_out + t0, s.master_bf16 + t0, n * sizeof(uint16_t));
}

// The update left a tile untouched where a scaled gradient was NaN or Inf (cpu_update_kernels.inc):
// an all-ones exponent, tested on the bits, so the loop vectorises (a float comparison's unordered
// case kept it scalar: a third of the retraction's time).
bool skipped_by_update(const detail::UpdateCoeffs& c, const float* g, int64_t n) {
  if (!c.check_finite) return false;
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i] * c.grad_scale;
    uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    bad |= static_cast<uint32_t>((b & 0x7F800000u) == 0x7F800000u);
  }
  return bad != 0;
}

// One tile's master and moments before the update (Note [Retraction]), in the update's order of
// operations but unfused: t.m and t.v hold the stored m1 and v1 on entry, root1 = sqrt(v1) (8-bit
// states store the root itself), and the values before on return. For AdamW c.wd is 0 and c.decay
// 1 - lr wd; for Adam the reverse.
// The divisions by constants are multiplications by their reciprocals.
inline void solve_back(const detail::UpdateCoeffs& c, Tile& t, const float* root1, int64_t n) {
  const float gs = c.grad_scale, wd = c.wd, inv_decay = 1.0f / c.decay, nss = c.neg_step_size;
  const float ibc2 = c.inv_sqrt_bc2, eps = c.eps, omb1 = c.omb1, omb2 = c.omb2;
  // b = 0: the update kept nothing of the old moments; before the first update they were zero, which
  // bf16 or 8-bit moments could not give back (their rounding of the first update's values is lost).
  const float inv_b1 = c.b1 != 0.0f && !c.first_step ? 1.0f / c.b1 : 0.0f;
  const float inv_b2 = c.b2 != 0.0f && !c.first_step ? 1.0f / c.b2 : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float denom = root1[i] * ibc2 + eps;
    const float p0 = (t.p[i] - (nss * t.m[i]) / denom) * inv_decay;
    const float g = t.g[i] * gs + wd * p0;
    t.p[i] = p0;
    t.m[i] = (t.m[i] - omb1 * g) * inv_b1;
    const float v0 = (t.v[i] - (omb2 * g) * g) * inv_b2;
    t.v[i] = v0 > 0.0f ? v0 : 0.0f;
  }
}

// Cloned for AVX-512 and AVX2 where the CPU has them: the tile's loops (conversions, square roots,
// the solve) run 16 or 8 lanes wide.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void retract_range(
    const detail::UpdateCoeffs& c, const UpdateSpan& s, int64_t begin, int64_t end) {
  const bool q8 = s.state_dtype == Dtype::kQ8;
  thread_local Tile tile;  // 32 KB: one per pool thread, not one per chunk
  Tile* const t = &tile;
  alignas(64) float root[kTile];
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t n = std::min(end, t0 + kTile) - t0, blk = t0 / kTile;
    load_master(s, t0, n, t->p, root);
    widen_dtype(s.grad, s.grad_dtype, t0, t->g, n);
    if (skipped_by_update(c, t->g, n)) continue;
    auto* mq = static_cast<int8_t*>(s.m);
    auto* vq = static_cast<uint8_t*>(s.v);
    if (q8) {
      q8::decode_block(mq + t0, vq + t0, s.m_scale[blk], s.v_scale[blk], n, t->m, root);
      for (int64_t i = 0; i < n; ++i) t->v[i] = root[i] * root[i];
    } else {
      widen_dtype(s.m, s.state_dtype, t0, t->m, n);
      widen_dtype(s.v, s.state_dtype, t0, t->v, n);
      for (int64_t i = 0; i < n; ++i) root[i] = std::sqrt(t->v[i]);
    }
    solve_back(c, *t, root, n);
    store_master(s, t0, n, *t);
    if (q8) {
      for (int64_t i = 0; i < n; ++i) root[i] = std::sqrt(t->v[i]);
      q8::encode_block(t->m, root, n, mq + t0, vq + t0, s.m_scale + blk, s.v_scale + blk);
    } else {
      narrow_dtype(t->m, s.m, s.state_dtype, t0, n);
      narrow_dtype(t->v, s.v, s.state_dtype, t0, n);
    }
  }
}

// Each span's coefficients of the update to take back.
std::vector<detail::UpdateCoeffs> retract_coeffs(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper) {
  TANDEM_ASSERT(hyper.rule == UpdateRule::kAdamW || hyper.rule == UpdateRule::kAdam,
                "only Adam's updates are retracted (speculation offloads Adam and AdamW only)");
  std::vector<detail::UpdateCoeffs> coeffs;
  for (size_t i = 0; i < spans.size(); ++i) {
    const UpdateSpan& s = spans[i];
    TANDEM_ASSERT(s.n == 0 || (s.grad && s.m && s.v && (s.master || s.master_bf16)), "span ", i,
                  " lacks a gradient, a master or Adam's states");
    coeffs.push_back(detail::make_coeffs(hyper, s));
  }
  return coeffs;
}

}  // namespace

void cpu_retract(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper, CpuThreadPool* pool) {
  const std::vector<detail::UpdateCoeffs> coeffs = retract_coeffs(spans, hyper);
  detail::for_each_chunk(spans, pool, [&](size_t span, int64_t begin, int64_t end) {
    retract_range(coeffs[span], spans[span], begin, end);
  });
}

RetractAndUpdate cpu_retract_and_update(const std::vector<UpdateSpan>& spans, const UpdateHyper& taken_back,
                                        const UpdateHyper& hyper, CpuThreadPool* pool) {
  const std::vector<detail::UpdateCoeffs> back = retract_coeffs(spans, taken_back);
  const detail::ChunkedUpdate done = detail::update_in_chunks(
      spans, hyper, nullptr, pool, active_cpu_isa(),
      [&](size_t span, int64_t begin, int64_t end) { retract_range(back[span], spans[span], begin, end); });
  RetractAndUpdate out;
  out.report = done.report;
  const double total = done.before_s + done.update_s;
  out.retract_share = total > 0.0 ? done.before_s / total : 0.0;
  return out;
}

}  // namespace tandem
