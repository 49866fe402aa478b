// AVX-512 kernels (16 lanes), in two forms: bf16 conversion in integer arithmetic (AVX-512 F/BW/VL)
// and with the VCVTNEPS2BF16 instruction (AVX-512 BF16). Called only when CPUID and the OS report
// the features.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/kernels/bf16_rounding.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/q8_codes.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
#include <immintrin.h>

namespace tandem::detail {
namespace {

#include "tandem/optim/cpu_update_kernels.inc"

template <bool kBf16Instructions>
struct Avx512Lanes {
  static constexpr int W = 16;
  using F = __m512;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m256i bf16_lanes(F x, __m512i bias) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(b, 16);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, bias), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    const __mmask16 tiny = _mm512_testn_epi32_mask(b, _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x0040)));
    r = _mm512_mask_mov_epi32(r, tiny, _mm512_and_si512(hi, _mm512_set1_epi32(0x8000)));
    return _mm512_cvtepi32_epi16(r);
  }
  static __m256i rne(F x) {
    if constexpr (kBf16Instructions) {
      return (__m256i)_mm512_cvtneps_pbh(x);
    } else {
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 16), _mm512_set1_epi32(1));
      return bf16_lanes(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    }
  }
  static void store_bf16(uint16_t* p, F x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), rne(x)); }
  static void stream_bf16(uint16_t* p, F x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), rne(x)); }
  static __m512i mul32(__m512i a, uint32_t k) { return _mm512_mullo_epi32(a, _mm512_set1_epi32(static_cast<int>(k))); }
  static __m512i random(uint32_t idx, uint32_t seed) {
    __m512i x = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(idx)),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    x = _mm512_xor_si512(mul32(x, 0x9E3779B1u), _mm512_set1_epi32(static_cast<int>(seed)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = mul32(x, 0x7FEB352Du);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = mul32(x, 0x846CA68Bu);
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  }
  static void store_bf16_sr(uint16_t* p, F x, uint32_t idx, uint32_t seed) {
    const __m512i bias = _mm512_and_si512(random(idx, seed), _mm512_set1_epi32(0xFFFF));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_lanes(x, bias));
  }
  static void store_bf16_rz(uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_lanes(x, _mm512_setzero_si512()));
  }
  static F select_eq(F a, F b, F x, F y) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), y, x); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F sign(F x) {
    const F zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    return _mm512_sub_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), one),
                         _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), one));
  }
  static int nonfinite(F x) {
    return __builtin_popcount(_mm512_cmp_ps_mask(_mm512_sub_ps(x, x), _mm512_setzero_ps(), _CMP_NEQ_UQ));
  }
  using B = uint32_t;
  static B bad_init() { return 0; }
  static B bad_acc(B a, const float* g) {
    const __m512i exp = _mm512_set1_epi32(0x7F800000);
    return a | _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(g), exp), exp);
  }
  static B bad_acc(B a, const uint16_t* g) {
    const __m256i exp = _mm256_set1_epi16(0x7F80);
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
    return a | _mm256_cmpeq_epi16_mask(_mm256_and_si256(b, exp), exp);
  }
  static bool bad_any(B a) { return a != 0; }
  static void sfence() { _mm_sfence(); }
  // Note [8-bit states]: the codes of q8_codes.h, 16 at a time, in the same integer steps.
  static F decode_m8(const int8_t* q, F scale) {
    const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    const __m512i c = _mm512_abs_epi32(s);
    const __m512i r =
        _mm512_maskz_slli_epi32(_mm512_test_epi32_mask(c, c), _mm512_add_epi32(c, _mm512_set1_epi32(q8::kMBase)), 20);
    const __m512i x = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(r), scale));
    return _mm512_castsi512_ps(_mm512_xor_si512(x, _mm512_and_si512(s, _mm512_set1_epi32(INT32_MIN))));
  }
  static F decode_u8(const uint8_t* q, F scale) {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(c, _mm512_set1_epi32(q8::kVBase)), 19)),
                         scale);
  }
  // The code of each lane's value / scale: its top bits, `bias` added, less the base.
  static __m512i code_with(__m512i b, int shift, __m512i bias, uint32_t base, int top) {
    b = _mm512_add_epi32(b, bias);
    const __m512i c = _mm512_sub_epi32(_mm512_srli_epi32(b, shift), _mm512_set1_epi32(static_cast<int>(base)));
    return _mm512_min_epi32(_mm512_max_epi32(c, _mm512_setzero_si512()), _mm512_set1_epi32(top));
  }
  // Rounded to nearest even.
  static __m512i code(__m512i b, int shift, uint32_t half, uint32_t base, int top) {
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, shift), _mm512_set1_epi32(1));
    return code_with(b, shift, _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(half)), odd), base, top);
  }
  // m's codes from the codes of |m| / scale: negated where m is negative.
  static void store_m8(int8_t* q, F m, __m512i c) {
    const __m512i bits = _mm512_castps_si512(m);
    c = _mm512_mask_sub_epi32(c, _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512()), _mm512_setzero_si512(), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(c));
  }
  static __m512i abs_scaled(F m, F inv) {
    const F a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(m), _mm512_set1_epi32(0x7FFFFFFF)));
    return _mm512_castps_si512(_mm512_mul_ps(a, inv));
  }
  static void encode_m8(int8_t* q, F m, F inv) { store_m8(q, m, code(abs_scaled(m, inv), 20, 0x7FFFFu, q8::kMBase, 127)); }
  static void encode_u8(uint8_t* q, F u, F inv) {
    const __m512i c = code(_mm512_castps_si512(_mm512_mul_ps(u, inv)), 19, 0x3FFFFu, q8::kVBase, 255);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(c));
  }
  // Note [8-bit stochastic codes]: q8::m_random_addend and u_random_addend of one hash a lane.
  static void encode8_sr(int8_t* mq, uint8_t* vq, F m, F u, F m_inv, F u_inv, uint32_t idx, uint32_t seed) {
    const __m512i r = random(idx, seed);
    const __m512i m_add = _mm512_slli_epi32(_mm512_and_si512(r, _mm512_set1_epi32(0xFFFF)), 4);
    const __m512i u_add = _mm512_slli_epi32(_mm512_srli_epi32(r, 16), 3);
    store_m8(mq, m, code_with(abs_scaled(m, m_inv), 20, m_add, q8::kMBase, 127));
    const __m512i c = code_with(_mm512_castps_si512(_mm512_mul_ps(u, u_inv)), 19, u_add, q8::kVBase, 255);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(vq), _mm512_cvtepi32_epi8(c));
  }
  // The largest |x| of each lane so far, compared as the integers of the bits (q8::max_abs).
  static F max_abs(F acc, F x) {
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF));
    return _mm512_castsi512_ps(_mm512_max_epu32(_mm512_castps_si512(acc), a));
  }
  static float lanes_max(F acc) { return q8::float_of(_mm512_reduce_max_epu32(_mm512_castps_si512(acc))); }
};

}  // namespace

KernelTable avx512_kernels(bool bf16_instructions) {
  if (bf16_instructions)
    return {&update_entry<Avx512Lanes<true>>, &to_bf16_entry<Avx512Lanes<true>>, &split_bf16_entry<Avx512Lanes<true>>};
  return {&update_entry<Avx512Lanes<false>>, &to_bf16_entry<Avx512Lanes<false>>, &split_bf16_entry<Avx512Lanes<false>>};
}

}  // namespace tandem::detail

#else

namespace tandem::detail {
KernelTable avx512_kernels(bool) { return {nullptr, nullptr, nullptr}; }
}  // namespace tandem::detail

#endif
