#pragma once
// 8-bit optimizer states: the codes of one block and its scales (Note [8-bit states]). Plain
// C++ without LibTorch, included by the CPU update kernels of every instruction set and by the
// store that moves states between tiers, so all of them quantise the same way, bit for bit.
//
// Note [8-bit states]
// With optim.state_dtype=int8 the Adam moments of CPU-updated parameters live on the host in one
// byte each, with one fp32 scale per block of 2048 elements of a parameter (its largest magnitude),
// as the block-wise 8-bit optimizers do: 2 bytes per parameter and 4 per 2048 for the states,
// against 8 (fp32) or 4 (bf16), so the host holds the fp32 master and both moments in 6 bytes per
// parameter. Each value is stored relative to its block's scale as a small float: an exponent and a
// few mantissa bits, so values far below the block's largest keep their relative precision (the
// published optimizers' dynamic quantisation makes the same trade; a linear code would flush most of a
// block to zero):
//   m (signed)     sign and 7 bits: 4 exponent bits and 3 mantissa bits, down to 2^-16 of the scale
//                  (a relative error of at most 1/16), smaller values stored as 0;
//   v (unsigned)   stored as sqrt(v), 8 bits: 4 exponent bits and 4 mantissa bits (at most 1/32), its
//                  smallest code 2^-16 of the scale: a smaller sqrt(v) is stored as that, never as 0,
//                  so a quantised v can only enlarge the denominator of the update, never zero it.
// The codes are the top bits of the fp32 representation of value / scale, rounded to nearest even,
// so encoding and decoding are integer shifts and adds. An update dequantises a tile of the moments
// into fp32, runs the fp32 Adam update on it (the master and the weights sent to the GPU see the
// unquantised new moments), then quantises the new moments with the tile's new scales. Blocks start
// at each parameter's first element (a span's tiles), so a parameter owns its scales; sharded
// stores quantise each rank's slice of a parameter the same way. Checkpoints hold the states
// decoded to fp32 (engine/host_states), which encode back to the same codes: a resume is exact where
// each Block is updated on the same side as in the uninterrupted run (a fixed offload.update_split;
// a GPU-updated Block keeps fp32 states, so an adaptive split that decides otherwise after a resume
// quantises at other steps), and fp32, bf16 and int8 runs resume from one another; writing one takes
// 8 bytes of host memory a parameter for the copies while it is written.
//
// Note [8-bit stochastic codes]
// Rounded to nearest, a moment moves only when its new value crosses half a code: sqrt(v) has 4
// mantissa bits (a code is 3-6 % of it), and with beta2 = 0.95 a step moves v by at most 5 %, so a v
// that should shrink as the gradients do cannot, in about half of each binade
// (Q8States.StochasticCodesFollowAShrinkingVThatNearestCodesHold). With optim.state_rounding=stochastic
// the update kernels round each new code up with probability equal to the fraction that nearest
// rounding would drop, so a moment's code is its value on average and small steps land. The random
// bits are random_bits(element index, the step's seed) of kernels/bf16_rounding.h, one hash an
// element: its low 16 bits round m, its high 16 bits sqrt(v), each placed just below the rounded
// bit, so every instruction set gives the same codes. Only the update rounds stochastically: a
// code's own value encodes back to itself either way, and the stores between tiers and the
// retraction round to nearest. A retraction solves the codes before back from those after: within
// half a code of them after nearest codes, up to a whole code after stochastic ones, so a clipped
// speculative step with stochastic codes may leave a moment one code from where an exact step would. On the 1B curves (docs/benchmarks.md, 2026-12-03) both roundings ended within 1 % of
// GPU-only AdamW and no gain of one over the other showed, while stochastic codes take 6 % more update
// time, so nearest stays the default.

#include <cstdint>
#include <cstring>

namespace tandem::q8 {
// Internal linkage: each translation unit (the kernels are built once per instruction set) keeps
// its own copies, so no function compiled for AVX-512 can stand in for another's.
namespace {

constexpr int64_t kBlock = 2048;  ///< elements per scale: the update kernels' tile

/// Scales of a range of n elements (one per started block).
constexpr int64_t scale_count(int64_t n) { return (n + kBlock - 1) / kBlock; }

inline uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

constexpr uint32_t kMBase = (127u << 3) - 127u;  // m: (bits >> 20) - kMBase; code 127 is 1.0
constexpr uint32_t kVBase = (127u << 4) - 255u;  // sqrt(v): (bits >> 19) - kVBase; code 255 is 1.0
constexpr float kMinNormal = 1.17549435e-38f;   // a block whose scale is below this is stored as zeros

/// 1 / scale, or 0 for a block stored as zeros.
inline float inverse(float scale) { return scale >= kMinNormal ? 1.0f / scale : 0.0f; }

/// The rounding addends of Note [8-bit stochastic codes]: below bit 20 (m) and bit 19 (sqrt(v)).
constexpr uint32_t m_random_addend(uint32_t r) { return (r & 0xFFFFu) << 4; }
constexpr uint32_t u_random_addend(uint32_t r) { return (r >> 16) << 3; }

/// m's code: +-c for |m| / scale rounded to 4 exponent and 3 mantissa bits (c = 0: zero); rounded to
/// nearest even, or with `random` (32 bits, Note [8-bit stochastic codes]) stochastically.
inline int8_t encode_m(float m, float inv, bool nearest = true, uint32_t random = 0) {
  uint32_t b = bits_of(m) & 0x7FFFFFFFu;
  b = bits_of(float_of(b) * inv);
  b += nearest ? 0x7FFFFu + ((b >> 20) & 1u) : m_random_addend(random);
  int32_t c = static_cast<int32_t>(b >> 20) - static_cast<int32_t>(kMBase);
  c = c < 0 ? 0 : (c > 127 ? 127 : c);
  return static_cast<int8_t>((bits_of(m) >> 31) != 0u ? -c : c);
}

inline float decode_m(int8_t q, float scale) {
  const int32_t c = q < 0 ? -q : q;
  const float r = c == 0 ? 0.0f : float_of((static_cast<uint32_t>(c) + kMBase) << 20);
  const float x = r * scale;
  return q < 0 ? -x : x;
}

/// sqrt(v)'s code: u / scale rounded to 4 exponent and 4 mantissa bits, at least code 0 (2^-16);
/// rounded as encode_m says.
inline uint8_t encode_u(float u, float inv, bool nearest = true, uint32_t random = 0) {
  uint32_t b = bits_of(u * inv);
  b += nearest ? 0x3FFFFu + ((b >> 19) & 1u) : u_random_addend(random);
  int32_t c = static_cast<int32_t>(b >> 19) - static_cast<int32_t>(kVBase);
  c = c < 0 ? 0 : (c > 255 ? 255 : c);
  return static_cast<uint8_t>(c);
}

/// sqrt(v) from its code.
inline float decode_u(uint8_t q, float scale) { return float_of((static_cast<uint32_t>(q) + kVBase) << 19) * scale; }

inline float decode_v(uint8_t q, float scale) {
  const float u = decode_u(q, scale);
  return u * u;
}

/// The largest |x| of n values, as the bits of a non-negative float (whose integer order is its order).
inline float max_abs(const float* x, int64_t n) {
  uint32_t mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = bits_of(x[i]) & 0x7FFFFFFFu;
    mx = b > mx ? b : mx;
  }
  return float_of(mx);
}

/// Dequantises one block of n <= kBlock elements into m and u = sqrt(v) (the update squares u in
/// its registers and hands back the square root it takes anyway).
inline void decode_block(const int8_t* mq, const uint8_t* vq, float m_scale, float v_scale, int64_t n, float* m,
                         float* u) {
  for (int64_t i = 0; i < n; ++i) m[i] = decode_m(mq[i], m_scale);
  for (int64_t i = 0; i < n; ++i) u[i] = decode_u(vq[i], v_scale);
}

/// Quantises one block of n <= kBlock elements of m and u = sqrt(v) with its new scales.
inline void encode_block(const float* m, const float* u, int64_t n, int8_t* mq, uint8_t* vq, float* m_scale,
                         float* v_scale) {
  const float ms = max_abs(m, n), us = max_abs(u, n);
  const float mi = inverse(ms), ui = inverse(us);
  for (int64_t i = 0; i < n; ++i) mq[i] = encode_m(m[i], mi);
  for (int64_t i = 0; i < n; ++i) vq[i] = encode_u(u[i], ui);
  *m_scale = mi == 0.0f ? 0.0f : ms;
  *v_scale = ui == 0.0f ? 0.0f : us;
}

/// Dequantises n elements (blocks from element 0) into fp32 m and v.
inline void decode(const int8_t* mq, const uint8_t* vq, const float* m_scale, const float* v_scale, int64_t n,
                   float* m, float* v) {
  for (int64_t b = 0; b * kBlock < n; ++b) {
    const int64_t o = b * kBlock, len = n - o < kBlock ? n - o : kBlock;
    decode_block(mq + o, vq + o, m_scale[b], v_scale[b], len, m + o, v + o);
    for (int64_t i = o; i < o + len; ++i) v[i] = v[i] * v[i];
  }
}

/// Quantises n fp32 elements of m and v (blocks from element 0).
inline void encode(const float* m, const float* v, int64_t n, int8_t* mq, uint8_t* vq, float* m_scale,
                   float* v_scale) {
  alignas(64) float u[kBlock];
  for (int64_t b = 0; b * kBlock < n; ++b) {
    const int64_t o = b * kBlock, len = n - o < kBlock ? n - o : kBlock;
    for (int64_t i = 0; i < len; ++i) u[i] = __builtin_sqrtf(v[o + i]);
    encode_block(m + o, u, len, mq + o, vq + o, m_scale + b, v_scale + b);
  }
}

}  // namespace
}  // namespace tandem::q8
