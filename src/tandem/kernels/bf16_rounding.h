#pragma once
// The bf16 rounding rule, the stochastic-rounding stream and the Kahan pair that the CPU update
// kernels (optim/cpu_update_kernels.inc), their retraction (optim/cpu_retract.cpp) and the device
// Adam (kernels/device_adam.cu) share, bit for bit
// (Note [Device Adam]). Host and device code; internal linkage, since the CPU kernels compile it once
// per instruction set (Note [CPU update kernels]) and no two copies may be merged.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_BF16_ROUNDING_FN static __host__ __device__ __forceinline__
#else
#define TANDEM_BF16_ROUNDING_FN static inline
#endif

namespace tandem::detail {

/// The bits of an fp32 value.
TANDEM_BF16_ROUNDING_FN uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
#endif
}

/// f to bf16 by the AVX-512 BF16 instruction's rule: zero and subnormals to signed zero, NaN quieted,
/// Inf kept; rounded to nearest even, or the low 16 bits of `bias_low16` added before truncation
/// (0: toward zero; random bits: stochastic rounding).
TANDEM_BF16_ROUNDING_FN uint16_t f32_to_bf16_bits(float f, uint32_t bias_low16, bool nearest_even) {
  const uint32_t b = f32_bits(f);
  if ((b & 0x7F800000u) == 0) return static_cast<uint16_t>((b >> 16) & 0x8000u);           // zero, subnormal
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // NaN, quieted
  const uint32_t bias = nearest_even ? 0x7FFFu + ((b >> 16) & 1u) : (bias_low16 & 0xFFFFu);
  return static_cast<uint16_t>((b + bias) >> 16);
}

/// 32 random bits for element `idx` (its index modulo 2^32) of one update.
TANDEM_BF16_ROUNDING_FN uint32_t random_bits(uint32_t idx, uint32_t seed) {
  uint32_t x = (idx * 0x9E3779B1u) ^ seed;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

/// The fp32 value of bf16 bits.
TANDEM_BF16_ROUNDING_FN float bf16_bits_to_f32(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}

/// The Kahan pair of a bf16 master for one fp32 value (Note [bf16 master]): hi = x rounded to nearest
/// even, lo = x - hi rounded to nearest even, or toward zero where the pair's sum would round away
/// from hi; so the pair is canonical.
TANDEM_BF16_ROUNDING_FN void kahan_pair_bits(float x, uint16_t* hi, uint16_t* lo) {
  *hi = f32_to_bf16_bits(x, 0, true);
  const float h = bf16_bits_to_f32(*hi), c = x - h;
  *lo = f32_to_bf16_bits(c, 0, true);
  if (f32_to_bf16_bits(h + bf16_bits_to_f32(*lo), 0, true) != *hi) *lo = f32_to_bf16_bits(c, 0, false);
}

/// The seed of the second state's (v's) stream: seed ^ kSecondStateSeed, a stream apart from m's.
constexpr uint32_t kSecondStateSeed = 0x5BD1E995u;

}  // namespace tandem::detail

#undef TANDEM_BF16_ROUNDING_FN
