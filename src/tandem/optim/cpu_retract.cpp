#include "tandem/optim/cpu_retract.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/kernels/bf16_rounding.h"
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
// the undo log's bit-exact copy. No tile is solved back where the update skipped it (a non-finite
// gradient after scaling), so a NaN never enters. The pass reads and writes what the update does,
// in plain scalar code on the thread pool: a retraction costs a few times an update, once per
// clipped or skipped step, and the engine speculates only once steps stop clipping (kAuto).

namespace {

using detail::bf16_bits_to_f32;
using detail::f32_to_bf16_bits;

constexpr int64_t kTile = q8::kBlock;  // the update's tile: its non-finite scan and one 8-bit block
constexpr int64_t kChunk = 1 << 16;    // cpu_update's chunk: a multiple of the tile

float load(const void* p, Dtype d, int64_t i) {
  return d == Dtype::kF32 ? static_cast<const float*>(p)[i] : bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
}

void store(void* p, Dtype d, int64_t i, float x) {
  if (d == Dtype::kF32)
    static_cast<float*>(p)[i] = x;
  else
    static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(x, 0, true);
}

float load_master(const UpdateSpan& s, int64_t i) {
  if (s.master != nullptr) return s.master[i];
  const float hi = bf16_bits_to_f32(s.master_bf16[i]);
  return s.master_comp != nullptr ? hi + bf16_bits_to_f32(s.master_comp[i]) : hi;
}

void store_master(const UpdateSpan& s, int64_t i, float p) {
  if (s.master != nullptr) {
    s.master[i] = p;
    if (s.bf16_out != nullptr) s.bf16_out[i] = f32_to_bf16_bits(p, 0, true);
    return;
  }
  if (s.master_comp != nullptr)
    detail::kahan_pair_bits(p, s.master_bf16 + i, s.master_comp + i);
  else
    s.master_bf16[i] = f32_to_bf16_bits(p, 0, true);
  if (s.bf16_out != nullptr) s.bf16_out[i] = s.master_bf16[i];
}

// The update left a tile untouched where a scaled gradient was NaN or Inf (cpu_update_kernels.inc).
bool skipped_by_update(const detail::UpdateCoeffs& c, const UpdateSpan& s, int64_t t0, int64_t len) {
  if (!c.check_finite) return false;
  for (int64_t i = t0; i < t0 + len; ++i) {
    const float g = load(s.grad, s.grad_dtype, i) * c.grad_scale;
    if (!std::isfinite(g)) return true;
  }
  return false;
}

struct Before {
  float p, m, v;
};

// One element's master and moments before the update (Note [Retraction]), in the update's order of
// operations: v1 the stored second moment, root1 the square root the update took of it.
Before solve_back(const detail::UpdateCoeffs& c, float p2, float m1, float v1, float root1, float graw) {
  const float denom = std::fma(root1, c.inv_sqrt_bc2, c.eps);
  Before b;
  b.p = (p2 - (c.neg_step_size * m1) / denom) / c.decay;  // decay is 1 for Adam
  const float g = graw * c.grad_scale + (c.rule == UpdateRule::kAdam ? c.wd * b.p : 0.0f);
  b.m = c.b1 != 0.0f ? (m1 - c.omb1 * g) / c.b1 : 0.0f;
  b.v = c.b2 != 0.0f ? std::max(0.0f, (v1 - (c.omb2 * g) * g) / c.b2) : 0.0f;
  return b;
}

void retract_range(const detail::UpdateCoeffs& c, const UpdateSpan& s, int64_t begin, int64_t end) {
  const bool q8 = s.state_dtype == Dtype::kQ8;
  alignas(64) float tm[kTile], tu[kTile];
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t len = std::min(end, t0 + kTile) - t0, blk = t0 / kTile;
    if (skipped_by_update(c, s, t0, len)) continue;
    auto* mq = static_cast<int8_t*>(s.m);
    auto* vq = static_cast<uint8_t*>(s.v);
    if (q8) q8::decode_block(mq + t0, vq + t0, s.m_scale[blk], s.v_scale[blk], len, tm, tu);
    for (int64_t k = 0; k < len; ++k) {
      const int64_t i = t0 + k;
      const float m1 = q8 ? tm[k] : load(s.m, s.state_dtype, i);
      const float v1 = q8 ? tu[k] * tu[k] : load(s.v, s.state_dtype, i);
      const float root1 = q8 ? tu[k] : std::sqrt(v1);
      const Before b = solve_back(c, load_master(s, i), m1, v1, root1, load(s.grad, s.grad_dtype, i));
      store_master(s, i, b.p);
      if (q8) {
        tm[k] = b.m;
        tu[k] = std::sqrt(b.v);
      } else {
        store(s.m, s.state_dtype, i, b.m);
        store(s.v, s.state_dtype, i, b.v);
      }
    }
    if (q8) q8::encode_block(tm, tu, len, mq + t0, vq + t0, s.m_scale + blk, s.v_scale + blk);
  }
}

}  // namespace

void cpu_retract(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper, CpuThreadPool* pool) {
  TANDEM_ASSERT(hyper.rule == UpdateRule::kAdamW || hyper.rule == UpdateRule::kAdam,
                "only Adam's updates are retracted (speculation offloads Adam and AdamW only)");
  struct Chunk {
    size_t span;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  std::vector<detail::UpdateCoeffs> coeffs;
  for (size_t i = 0; i < spans.size(); ++i) {
    const UpdateSpan& s = spans[i];
    TANDEM_ASSERT(s.n == 0 || (s.grad && s.m && s.v && (s.master || s.master_bf16)), "span ", i,
                  " lacks a gradient, a master or Adam's states");
    coeffs.push_back(detail::make_coeffs(hyper, s));
    for (int64_t b = 0; b < s.n; b += kChunk) chunks.push_back({i, b, std::min(s.n, b + kChunk)});
  }
  CpuThreadPool& p = pool != nullptr ? *pool : CpuThreadPool::global();
  p.run(static_cast<int64_t>(chunks.size()), [&](int64_t t) {
    const Chunk& ch = chunks[static_cast<size_t>(t)];
    retract_range(coeffs[ch.span], spans[ch.span], ch.begin, ch.end);
  });
}

}  // namespace tandem
