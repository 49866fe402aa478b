// The scalar reference of the CPU update kernels: one lane, the same operations in the same order
// as the SIMD kernels (fused multiply-adds where they fuse), so every kernel must match it bit for
// bit. Built with -ffp-contract=off so the compiler adds no fusion of its own.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/kernels/bf16_rounding.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/q8_codes.h"

namespace tandem::detail {
namespace {

#include "tandem/optim/cpu_update_kernels.inc"

struct ScalarLanes {
  static constexpr int W = 1;
  using F = float;
  static F load(const float* p) { return *p; }
  static void store(float* p, F x) { *p = x; }
  static F load_bf16(const uint16_t* p) { return bf16_bits_to_f32(*p); }
  static void store_bf16(uint16_t* p, F x) { *p = f32_to_bf16_bits(x, 0, true); }
  static void stream_bf16(uint16_t* p, F x) { store_bf16(p, x); }
  static void store_bf16_sr(uint16_t* p, F x, uint32_t idx, uint32_t seed) {
    *p = f32_to_bf16_bits(x, random_bits(idx, seed), false);
  }
  static void store_bf16_rz(uint16_t* p, F x) { *p = f32_to_bf16_bits(x, 0, false); }
  static F select_eq(F a, F b, F x, F y) { return a == b ? x : y; }
  static F set1(float x) { return x; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return __builtin_sqrtf(a); }
  static F fma(F a, F b, F c) { return __builtin_fmaf(a, b, c); }
  static F sign(F x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }
  static int nonfinite(F x) { return x - x != 0.0f ? 1 : 0; }
  using B = uint32_t;
  static B bad_init() { return 0; }
  static B bad_acc(B a, const float* g) { return a | ((f32_bits(*g) & 0x7F800000u) == 0x7F800000u); }
  static B bad_acc(B a, const uint16_t* g) { return a | ((*g & 0x7F80u) == 0x7F80u); }
  static bool bad_any(B a) { return a != 0; }
  static void sfence() {}
  // Note [8-bit states]: the codes themselves.
  static F decode_m8(const int8_t* q, F scale) { return q8::decode_m(*q, scale); }
  static F decode_u8(const uint8_t* q, F scale) { return q8::decode_u(*q, scale); }
  static void encode_m8(int8_t* q, F m, F inv) { *q = q8::encode_m(m, inv); }
  static void encode_u8(uint8_t* q, F u, F inv) { *q = q8::encode_u(u, inv); }
  static void encode8_sr(int8_t* mq, uint8_t* vq, F m, F u, F m_inv, F u_inv, uint32_t idx, uint32_t seed) {
    const uint32_t r = random_bits(idx, seed);
    *mq = q8::encode_m(m, m_inv, false, r);
    *vq = q8::encode_u(u, u_inv, false, r);
  }
  static F max_abs(F acc, F x) { return q8::max_abs(&x, 1) > acc ? q8::max_abs(&x, 1) : acc; }
  static float lanes_max(F acc) { return acc; }
};

}  // namespace

KernelTable scalar_kernels() {
  return {&update_entry<ScalarLanes>, &to_bf16_entry<ScalarLanes>, &split_bf16_entry<ScalarLanes>};
}

}  // namespace tandem::detail
